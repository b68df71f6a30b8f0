//! Samples in, tables out: the A/B table of two builds, and one build's table against
//! the floor and the best peer.
//!
//! A sample file has one line per sample, `workload<TAB>contender<TAB>ns`. Single-thread
//! workloads are summed up by their minimum over the samples (the run least disturbed by
//! a noisy machine), two-thread ones (named `... 2t`) by their median (their spread
//! comes from scheduling).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Samples by (workload, contender), in the order the cells first appear.
#[derive(Default)]
pub struct Samples {
    order: Vec<(String, String)>,
    by_cell: BTreeMap<(String, String), Vec<f64>>,
}

impl Samples {
    /// Parses a sample file; a line that is not `workload<TAB>contender<TAB>ns` is an
    /// error naming it.
    pub fn parse(text: &str) -> Result<Samples, String> {
        let mut s = Samples::default();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let mut f = line.split('\t');
            let (Some(w), Some(c), Some(ns), None) = (f.next(), f.next(), f.next(), f.next())
            else {
                return Err(format!(
                    "line {}: not workload, contender, ns: {line:?}",
                    n + 1
                ));
            };
            let ns: f64 = ns
                .parse()
                .map_err(|_| format!("line {}: not a number of ns: {ns:?}", n + 1))?;
            s.push(w, c, ns);
        }
        Ok(s)
    }

    pub fn push(&mut self, workload: &str, contender: &str, ns: f64) {
        let key = (workload.to_owned(), contender.to_owned());
        let v = self.by_cell.entry(key.clone()).or_default();
        if v.is_empty() {
            self.order.push(key);
        }
        v.push(ns);
    }

    fn get(&self, workload: &str, contender: &str) -> Option<&[f64]> {
        self.by_cell
            .get(&(workload.to_owned(), contender.to_owned()))
            .map(Vec::as_slice)
    }

    fn workloads(&self) -> Vec<&str> {
        let mut w: Vec<&str> = Vec::new();
        for (work, _) in &self.order {
            if !w.contains(&work.as_str()) {
                w.push(work);
            }
        }
        w
    }
}

/// Whether `workload` runs on two threads (its samples are summed up by the median).
pub fn two_threads(workload: &str) -> bool {
    workload.ends_with(" 2t")
}

/// The `q`-quantile of `v`: the sample at rank `round((n - 1) q)` (of an even count, the
/// median is the upper of the middle two), `q` in [0, 1].
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() - 1) as f64 * q).round() as usize;
    s[i]
}

/// A workload's figure: the minimum of a single-thread workload's samples, the median of
/// a two-thread one's.
pub fn figure(workload: &str, v: &[f64]) -> f64 {
    quantile(v, if two_threads(workload) { 0.5 } else { 0.0 })
}

/// The name of the floor contender, the baseline of every ratio within one build.
pub const FLOOR: &str = "floor";

/// Contenders that are peers (the best of them is a table's other baseline).
pub const PEERS: [&str; 3] = ["jemalloc", "mimalloc", "glibc"];

/// The A/B table: for every cell of both builds, each build's figure, their ratio
/// (new / old: below 1 means the new build is faster), the ratio of their medians as a
/// second view, and each build's ratio to its own floor. The floor's own new / old row
/// is the control: the same code in both, so it shows the run's noise.
pub fn ab_table(old: &Samples, new: &Samples, old_label: &str, new_label: &str) -> String {
    let mut out = String::new();
    let n = old
        .by_cell
        .values()
        .chain(new.by_cell.values())
        .map(Vec::len)
        .min()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "A/B, interleaved: old = {old_label}, new = {new_label}; {n}+ samples a cell \
         in each; one thread: min, two threads (2t): median; ns per pair (W1), object \
         (W2, W3) or request"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| workload | contender | old | new | new/old | new/old (medians) | old/floor | new/floor |"
    );
    let _ = writeln!(
        out,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for w in new.workloads() {
        let floor = |s: &Samples| s.get(w, FLOOR).map(|v| figure(w, v));
        let (of, nf) = (floor(old), floor(new));
        for (work, c) in new.order.iter().filter(|(work, _)| work == w) {
            let (Some(o), Some(nv)) = (old.get(work, c), new.get(work, c)) else {
                continue;
            };
            let (fo, fnew) = (figure(w, o), figure(w, nv));
            let ratio = |a: f64, b: Option<f64>| match b {
                Some(b) => format!("{:.2}x", a / b),
                None => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {w} | {c} | {fo:.2} | {fnew:.2} | **{:.3}x** | {:.3}x | {} | {} |",
                fnew / fo,
                quantile(nv, 0.5) / quantile(o, 0.5),
                ratio(fo, of),
                ratio(fnew, nf),
            );
        }
    }
    out
}

/// One build's table: every cell's figure, its ratio to the floor and to the best peer
/// of its workload, and its 10th and 90th percentiles.
pub fn table(s: &Samples) -> String {
    let mut out = String::new();
    let n = s.by_cell.values().map(Vec::len).min().unwrap_or(0);
    let _ = writeln!(
        out,
        "{n}+ interleaved samples a cell; one thread: min, two threads (2t): median"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| workload | contender | ns | vs floor | vs best peer | p10 | p90 |"
    );
    let _ = writeln!(out, "| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for w in s.workloads() {
        let floor = s.get(w, FLOOR).map(|v| figure(w, v));
        let best_peer = PEERS
            .iter()
            .filter_map(|p| s.get(w, p).map(|v| figure(w, v)))
            .min_by(f64::total_cmp);
        for (work, c) in s.order.iter().filter(|(work, _)| work == w) {
            let v = s.get(work, c).expect("listed cells have samples");
            let f = figure(w, v);
            let ratio = |b: Option<f64>| match b {
                Some(b) => format!("{:.2}x", f / b),
                None => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {w} | {c} | {f:.2} | {} | {} | {:.2} | {:.2} |",
                ratio(floor),
                ratio(best_peer),
                quantile(v, 0.1),
                quantile(v, 0.9),
            );
        }
    }
    out
}

/// Several runs' table (each run its own process): each cell's figure and its ratios
/// to the floor and the best peer, each worked out within a run, as their range over
/// the runs.
pub fn table_runs(runs: &[Samples]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    if runs.len() == 1 {
        return table(first);
    }
    let mut out = String::new();
    let n = runs
        .iter()
        .flat_map(|s| s.by_cell.values().map(Vec::len))
        .min()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "{} runs, {n}+ interleaved samples a cell in each; one thread: min, two threads \
         (2t): median; each range is over the runs",
        runs.len()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| workload | contender | ns | vs floor | vs best peer |"
    );
    let _ = writeln!(out, "| --- | --- | ---: | ---: | ---: |");
    for w in first.workloads() {
        for (work, c) in first.order.iter().filter(|(work, _)| work == w) {
            let (mut ns, mut floor, mut peer) = (Vec::new(), Vec::new(), Vec::new());
            for s in runs {
                let Some(v) = s.get(work, c) else { continue };
                let f = figure(w, v);
                ns.push(f);
                if let Some(fl) = s.get(w, FLOOR) {
                    floor.push(f / figure(w, fl));
                }
                if let Some(p) = PEERS
                    .iter()
                    .filter_map(|p| s.get(w, p).map(|v| figure(w, v)))
                    .min_by(f64::total_cmp)
                {
                    peer.push(f / p);
                }
            }
            let range = |v: &[f64], unit: &str| match (
                v.iter().copied().min_by(f64::total_cmp),
                v.iter().copied().max_by(f64::total_cmp),
            ) {
                (Some(lo), Some(hi)) if format!("{lo:.2}") == format!("{hi:.2}") => {
                    format!("{lo:.2}{unit}")
                }
                (Some(lo), Some(hi)) => format!("{lo:.2}–{hi:.2}{unit}"),
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {w} | {c} | {} | {} | {} |",
                range(&ns, ""),
                range(&floor, "x"),
                range(&peer, "x"),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_thread_cells_take_the_min_and_two_thread_ones_the_median() {
        assert_eq!(figure("W1 pair", &[3.0, 1.0, 2.0]), 1.0);
        assert_eq!(figure("W3 2t", &[3.0, 1.0, 2.0, 9.0, 8.0]), 3.0);
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0, 5.0], 0.9), 5.0);
    }

    #[test]
    fn the_ab_table_divides_new_by_old_within_each_cell() {
        let old = Samples::parse("W1 pair\tfloor\t2\nW1 pair\tClassBox\t4\nW1 pair\tClassBox\t5\n")
            .unwrap();
        let new = Samples::parse("W1 pair\tfloor\t2\nW1 pair\tClassBox\t3\nW1 pair\tClassBox\t9\n")
            .unwrap();
        let t = ab_table(&old, &new, "a", "b");
        // ClassBox: min 4 -> 3 (0.75x); medians by nearest rank, which of two samples
        // is the upper: 5 -> 9; floor 2 in both.
        assert!(
            t.contains("| W1 pair | ClassBox | 4.00 | 3.00 | **0.750x** |"),
            "{t}"
        );
        assert!(t.contains("| **0.750x** | 1.800x | 2.00x | 1.50x |"), "{t}");
        assert!(
            t.contains("| W1 pair | floor | 2.00 | 2.00 | **1.000x** |"),
            "{t}"
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = Samples::parse("W1\tfloor\t2\nW1 floor 2\n").err().unwrap();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = Samples::parse("W1\tfloor\tfast\n").err().unwrap();
        assert!(e.contains("not a number"), "{e}");
    }

    #[test]
    fn several_runs_give_ranges_of_ratios_worked_out_within_each_run() {
        let a = Samples::parse("R\tfloor\t10\nR\tone-word\t15\nR\tjemalloc\t30\n").unwrap();
        let b = Samples::parse("R\tfloor\t20\nR\tone-word\t20\nR\tjemalloc\t40\n").unwrap();
        let t = table_runs(&[a, b]);
        assert!(
            t.contains("| R | one-word | 15.00–20.00 | 1.00–1.50x | 0.50x |"),
            "{t}"
        );
        assert!(t.contains("| R | floor | 10.00–20.00 | 1.00x |"), "{t}");
    }

    #[test]
    fn the_table_compares_with_the_floor_and_the_best_peer() {
        let s = Samples::parse("R\tfloor\t10\nR\tjemalloc\t20\nR\tmimalloc\t40\nR\tone-word\t10\n")
            .unwrap();
        let t = table(&s);
        assert!(
            t.contains("| R | one-word | 10.00 | 1.00x | 0.50x |"),
            "{t}"
        );
    }
}
