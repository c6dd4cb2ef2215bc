//! The memory layout nvcc, cicc and ptxas run in: the same on every run.
//!
//! ptxas (12.9 and 13.0 alike) assigns registers in an order that follows where its data lies
//! in memory: one PTX file assembled twice by the same ptxas, in the same folder, with the same
//! command line, gives two cubins when the kernel is large (ThunderKittens' `bf16_b200_gemm`
//! for sm_100a: the code of 4 of its 7 kernels differs), because Linux places the heap, the
//! stack and every mapping at random addresses (ASLR). No ptxas option fixes it; a fixed layout
//! does:
//!
//! | set before the tool starts | why |
//! | --- | --- |
//! | `personality(ADDR_NO_RANDOMIZE)` | no random offsets: every mapping where the last run had it |
//! | the stack limit at [`STACK_LIMIT`] (the hard limit, if lower) | the kernel places mappings below the stack by its limit, and an unlimited one selects another layout altogether |
//!
//! Children inherit both, so nvcc's cicc and ptxas run that way too. Where the kernel refuses
//! (a seccomp filter on `personality`), the tool runs as it would have, and a large kernel may
//! come out in more than one way. The layout still depends on the kernel and the C library
//! the tools link, so the same bytes are promised on machines that share them. See
//! docs/toolchains.md, "Where a compile runs".
//!
//! Every `unsafe` of the compile executor is here: the hook that runs in the child between
//! `fork` and `exec`.

use std::process::Command;

/// The stack limit the tools run with: above the usual default of 8 MiB (the front end
/// recurses through deep templates), below the 128 MiB under which Linux places mappings at
/// the same address whatever the limit.
pub const STACK_LIMIT: u64 = 64 << 20;

/// `command`, set to start its program with the layout of every other run (see the module).
pub(super) fn with_fixed_layout(command: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the hook runs in the forked child before `exec`; it makes only the
        // async-signal-safe `personality`, `getrlimit` and `setrlimit` system calls, allocates
        // nothing and touches no lock.
        unsafe {
            command.pre_exec(|| {
                fix_layout();
                Ok(())
            });
        }
    }
    command
}

/// Turns address randomization off for this process and the program it executes, and sets
/// the stack limit to [`STACK_LIMIT`]; a call the kernel refuses is left as it was.
#[cfg(target_os = "linux")]
fn fix_layout() {
    /// `personality(0xffffffff)` reads the persona without changing it.
    const QUERY: libc::c_ulong = 0xffff_ffff;
    // SAFETY: `personality` only reads its integer argument.
    let persona = unsafe { libc::personality(QUERY) };
    if persona != -1 {
        let fixed = persona as libc::c_ulong | libc::ADDR_NO_RANDOMIZE as libc::c_ulong;
        // SAFETY: as above; a refusal returns -1 and changes nothing.
        unsafe { libc::personality(fixed) };
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` to the valid, exclusive pointer it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) } == 0 {
        // `RLIM_INFINITY` is the largest value, so an unlimited hard limit allows any.
        limit.rlim_cur = STACK_LIMIT.min(limit.rlim_max);
        // SAFETY: `setrlimit` reads one `rlimit` from the valid pointer it is given.
        unsafe { libc::setrlimit(libc::RLIMIT_STACK, &limit) };
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// What a tool started through [`with_fixed_layout`] sees, whatever its parent's: no
    /// address randomization in its persona, and the fixed stack limit.
    #[test]
    fn a_tool_starts_unrandomized_with_the_fixed_stack_limit() {
        let output = with_fixed_layout(&mut Command::new("sh"))
            .args(["-c", "cat /proc/self/personality; ulimit -s"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let (persona, stack_kib) = text.trim().split_once('\n').unwrap();
        let persona = u64::from_str_radix(persona, 16).unwrap();
        assert_ne!(persona & libc::ADDR_NO_RANDOMIZE as u64, 0, "{text}");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `fix_layout`.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) };
        assert_eq!(read, 0);
        let expected = STACK_LIMIT.min(limit.rlim_max) >> 10;
        assert_eq!(stack_kib.parse::<u64>().ok(), Some(expected), "{text}");
    }
}
