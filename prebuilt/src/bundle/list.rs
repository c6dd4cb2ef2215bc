//! The `bundle list` table.

use std::fmt::Write as _;

use crate::index::Index;

/// The `bundle list` table: one row per variant and per skip.
pub fn list_bundle(index: &Index) -> String {
    let mut rows = vec![[
        "kernel".to_owned(),
        "build".into(),
        "arch".into(),
        "compiler".into(),
        "size".into(),
        "stored".into(),
        "key".into(),
        "skipped because".into(),
    ]];
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            rows.push([
                kernel.clone(),
                variant.cuda.to_string(),
                variant.arch.to_string(),
                variant.compiler.to_string(),
                variant.artifact.size.to_string(),
                variant.artifact.stored_size.to_string(),
                variant.key[..12.min(variant.key.len())].to_owned(),
                String::new(),
            ]);
        }
        for skip in &record.skipped {
            rows.push([
                kernel.clone(),
                skip.cuda.to_string(),
                skip.arch.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                skip.reason.clone(),
            ]);
        }
    }
    // Extension modules after the kernels: `arch` is the module's CPU.
    for (name, record) in &index.modules {
        let kernel = format!("{name} (module)");
        for variant in &record.variants {
            let compilers: Vec<String> =
                variant.compilers.iter().map(ToString::to_string).collect();
            rows.push([
                kernel.clone(),
                variant.cuda.to_string(),
                variant.cpu.clone(),
                compilers.join(" + "),
                variant.artifact.size.to_string(),
                variant.artifact.stored_size.to_string(),
                variant.key[..12.min(variant.key.len())].to_owned(),
                String::new(),
            ]);
        }
        for skip in &record.skipped {
            let dash = || "-".to_owned();
            let cells = [kernel.clone(), skip.cuda.to_string(), skip.cpu.clone()];
            let [a, b, c] = cells;
            rows.push([a, b, c, dash(), dash(), dash(), dash(), skip.reason.clone()]);
        }
    }
    let mut widths = [0usize; 8];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (n, (cell, width)) in row.iter().zip(widths).enumerate() {
            if n > 0 {
                line.push_str("  ");
            }
            if n == 4 || n == 5 {
                let _ = write!(line, "{cell:>width$}");
            } else {
                let _ = write!(line, "{cell:<width$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
