//! Work bounded like bytes, and refusals that exit as refusals: crafted bundles and slow or
//! absent stores against the `kwheel` binary. Each test is named after the case it guards.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// Exit codes (`kwheel --help`).
const VERIFICATION: i32 = 4;
const NETWORK: i32 = 6;

fn fetch(bundle: &Path, cache: &Path) -> Command {
    let mut command = kwheel();
    command
        .arg("fetch")
        .arg(bundle)
        .args(["--device", "sm_100", "--cuda", "13.0"])
        .env("KWHEEL_ARTIFACT_CACHE", cache);
    command
}

/// A copy of the built bundle recording `store`, without its artifacts: `kwheel fetch` must
/// download what the device would load.
fn slim_bundle(dir: &Path, store: &str) -> PathBuf {
    let bundle = edited_bundle(dir, |index| {
        index["store"] = store.into();
    });
    std::fs::remove_dir_all(bundle.join("artifacts")).unwrap();
    bundle
}

#[test]
fn case_10_a_fifo_a_link_out_or_an_index_over_the_cap_exits_as_a_verification_failure() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    std::fs::create_dir(&fifo).unwrap();
    let status = Command::new("mkfifo")
        .arg(fifo.join("index.json"))
        .status()
        .unwrap();
    assert!(status.success());
    let message = failure(&bundle_list(&fifo), VERIFICATION);
    assert!(message.contains("not a regular file"), "{message}");

    let outside = dir.path().join("outside.json");
    std::fs::write(
        &outside,
        br#"{"format":2,"package":"p","torch":"2.13.*","kernels":{}}"#,
    )
    .unwrap();
    let linked = dir.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&outside, linked.join("index.json")).unwrap();
    let message = failure(&bundle_list(&linked), VERIFICATION);
    assert!(message.contains("leads out of the bundle"), "{message}");

    // 129 MiB on disk, none of it written: refused from its size, never read.
    let large = dir.path().join("large");
    std::fs::create_dir(&large).unwrap();
    std::fs::File::create(large.join("index.json"))
        .unwrap()
        .set_len(129 << 20)
        .unwrap();
    let message = failure(&bundle_list(&large), VERIFICATION);
    assert!(message.contains("cap"), "{message}");
}

#[test]
fn case_10_a_store_that_cannot_be_reached_exits_as_a_network_failure() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens, the connection is refused.
    let bundle = slim_bundle(dir.path(), "http://127.0.0.1:9");
    let output = fetch(&bundle, &dir.path().join("cache")).output().unwrap();
    let message = failure(&output, NETWORK);
    assert!(message.contains("could not be fetched"), "{message}");
    assert!(message.contains("127.0.0.1:9"), "{message}");
}

/// A server on loopback that answers every request with a 200 that promises 1 MB and sends
/// one byte every 100 ms: a slow store, not a dead one.
fn trickling_store() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n";
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for _ in 0..600 {
                    std::thread::sleep(Duration::from_millis(100));
                    if stream
                        .write_all(b"x")
                        .and_then(|()| stream.flush())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{address}")
}

/// Case 10: a slow store held `kwheel fetch` for 2 min per kernel (30 s a request, 4
/// attempts). The whole command now ends by one deadline (`KWHEEL_FETCH_DEADLINE`).
#[test]
fn case_10_a_slow_store_is_bounded_by_the_fetch_deadline() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bundle = slim_bundle(dir.path(), &trickling_store());
    let started = Instant::now();
    let output = fetch(&bundle, &dir.path().join("cache"))
        .env("KWHEEL_FETCH_DEADLINE", "2")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let message = failure(&output, NETWORK);
    assert!(
        message.contains("overall deadline of 2.0 s passed"),
        "{message}"
    );
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}: {message}");
    // Nothing half-downloaded is left in the cache.
    let cache = dir.path().join("cache");
    assert!(!cache.exists() || listing(&cache).iter().all(|p| !p.ends_with(".cubin")));

    let output = fetch(&bundle, &cache)
        .env("KWHEEL_FETCH_DEADLINE", "soon")
        .output()
        .unwrap();
    let message = failed(&output);
    assert!(
        message.contains("KWHEEL_FETCH_DEADLINE=`soon`"),
        "{message}"
    );
}

/// Case 7: one 8 KB frame holding 256 MiB, named by every variant, made `bundle extract` write
/// 256 MiB per variant (and `wheel verify` take ~1 s per variant). At the cap (now 64 MiB) it
/// is decoded once, streamed into its file, and the other variants' files are links to it.
#[test]
fn case_7_a_frame_shared_by_every_variant_is_extracted_once() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = prebuilt::untrusted::MAX_ARTIFACT_SIZE;
    let content = vec![0u8; size as usize];
    let digest = prebuilt::key::sha256_hex(&content);
    let frame = zstd::bulk::compress(&content, 19).unwrap();
    drop(content);
    assert!(frame.len() < 16 << 10, "{}", frame.len());
    let path = prebuilt::bundle::artifact_path(&digest);
    let mut variants = 0;
    let bundle = edited_bundle(dir.path(), |index| {
        for kernel in index["kernels"].as_object_mut().unwrap().values_mut() {
            for variant in kernel["variants"].as_array_mut().unwrap() {
                let artifact = &mut variant["artifact"];
                artifact["digest"] = digest.clone().into();
                artifact["path"] = path.clone().into();
                artifact["size"] = size.into();
                artifact["stored_size"] = (frame.len() as u64).into();
                artifact["dictionary"] = serde_json::Value::Null;
                variants += 1;
            }
        }
        index["dictionary"] = serde_json::Value::Null;
    });
    assert!(variants >= 2, "{variants}");
    std::fs::create_dir_all(bundle.join(&path).parent().unwrap()).unwrap();
    std::fs::write(bundle.join(&path), &frame).unwrap();
    let out = dir.path().join("out");
    let started = Instant::now();
    let output = bundle_extract(&bundle, &out);
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{}", text(&output));
    let files: Vec<String> = listing(&out)
        .into_iter()
        .filter(|path| path.ends_with(".cubin") || path.ends_with(".ptx"))
        .collect();
    assert_eq!(files.len(), variants, "{files:?}");
    let inodes: std::collections::BTreeSet<u64> = files
        .iter()
        .map(|file| std::fs::metadata(out.join(file)).unwrap().ino())
        .collect();
    assert_eq!(inodes.len(), 1, "written once: {files:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}
