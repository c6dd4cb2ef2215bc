//! Where an open `kernels.idx`'s bytes are: the file itself, read at offsets, or bytes already
//! read (a wheel's entry).

use std::fs::File;
use std::os::unix::fs::FileExt as _;

/// Where the file's bytes are: the file itself (and its size, from its `fstat`), or bytes
/// already read (a small file read whole, a wheel's entry).
#[derive(Debug)]
pub(super) enum Data {
    File(File, u64),
    Bytes(Vec<u8>),
}

/// A file of at most this many bytes is read whole when it is opened, in one call: finding a
/// kernel in it then reads nothing more, where a lookup in the file costs a positioned read
/// per table entry and name it visits (about what copying a few KiB costs each).
const READ_WHOLE_UP_TO: u64 = 16 << 10;

impl Data {
    /// The open `file` of `size` bytes (its `fstat`'s): read whole when it is small.
    pub(super) fn of_file(file: File, size: u64) -> std::io::Result<Data> {
        if size > READ_WHOLE_UP_TO {
            return Ok(Data::File(file, size));
        }
        let mut bytes = vec![0u8; size as usize];
        file.read_exact_at(&mut bytes, 0)?;
        Ok(Data::Bytes(bytes))
    }

    pub(super) fn read_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Data::File(file, _) => file.read_exact_at(buffer, offset),
            Data::Bytes(bytes) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                let span = start
                    .checked_add(buffer.len())
                    .and_then(|end| bytes.get(start..end))
                    .ok_or(std::io::ErrorKind::UnexpectedEof)?;
                buffer.copy_from_slice(span);
                Ok(())
            }
        }
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Data::File(_, size) => *size,
            Data::Bytes(bytes) => bytes.len() as u64,
        }
    }
}
