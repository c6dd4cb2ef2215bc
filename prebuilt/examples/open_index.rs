//! Open of a bundle's loader index and one kernel's record, the CPU part of a first call.
//!
//! ```text
//! cargo run --release -p prebuilt --example open_index -- <bundle> <kernel> [repetitions]
//! ```
//!
//! Prints the median and minimum of `Catalog::open` alone and of open + `record`, each
//! repetition from nothing (the file is in the page cache after the first).

use std::time::{Duration, Instant};

use prebuilt::lookup::Catalog;

fn main() -> Result<(), String> {
    let mut words = std::env::args().skip(1);
    let bundle = words.next().ok_or("give the bundle directory")?;
    let kernel = words.next().ok_or("give a kernel name")?;
    let repetitions: usize = words
        .next()
        .map_or(Ok(101), |n| n.parse())
        .map_err(|e| format!("{e}"))?;
    let (mut open, mut both) = (Vec::new(), Vec::new());
    for _ in 0..repetitions {
        let started = Instant::now();
        let catalog = Catalog::open(&bundle).map_err(|e| e.to_string())?;
        let opened = started.elapsed();
        catalog
            .record(&kernel)
            .map_err(|e| e.to_string())?
            .ok_or("no such kernel")?;
        both.push(started.elapsed());
        open.push(opened);
    }
    let show = |name: &str, times: &mut Vec<Duration>| {
        times.sort();
        println!(
            "{name}: median {:.1} µs, min {:.1} µs",
            times[times.len() / 2].as_secs_f64() * 1e6,
            times[0].as_secs_f64() * 1e6
        );
    };
    show("open", &mut open);
    show("open + record", &mut both);
    Ok(())
}
