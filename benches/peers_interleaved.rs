//! The peer comparison, interleaved: each round runs one sample of every contender on
//! every workload, so machine state changes hit all alike. Single-thread workloads report
//! the minimum over the rounds, two-thread ones the median; ratios are within the run.
//! Writes the table to stdout and `target/peers.csv`.
//!
//! `cargo bench --bench peers_interleaved -- [rounds]` (default 30)

mod suite;

use std::fmt::Write as _;

use suite::contenders::{contenders, mixes, Work};

struct Row {
    workload: String,
    name: &'static str,
    peer: bool,
    two_threads: bool,
    samples: Vec<f64>,
}

fn stat(r: &Row) -> f64 {
    let mut s = r.samples.clone();
    s.sort_by(f64::total_cmp);
    if r.two_threads {
        s[s.len() / 2]
    } else {
        s[0]
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let c64 = contenders::<64>();
    let c256 = contenders::<256>();
    let mix = mixes();
    let single = [("W1 pair", Work::W1(20_000)), ("W2 batch", Work::W2(10))];
    let multi = [
        ("W3 two threads", Work::W3(10)),
        ("W4 remote free", Work::W4(1000)),
    ];
    let mut rows: Vec<Row> = Vec::new();
    let row = |rows: &mut Vec<Row>, workload: String, name, peer, two, x: Option<f64>| {
        let Some(x) = x else { return };
        match rows
            .iter_mut()
            .find(|r| r.workload == workload && r.name == name)
        {
            Some(r) => r.samples.push(x),
            None => rows.push(Row {
                workload,
                name,
                peer,
                two_threads: two,
                samples: vec![x],
            }),
        }
    };
    for round in 0..=rounds {
        let keep = round > 0; // round 0 warms up
        for (size, list) in [(64, &c64), (256, &c256)] {
            for (wname, w) in single.iter().chain(&multi) {
                let two = matches!(w, Work::W3(_) | Work::W4(_));
                if size == 256 && two {
                    continue;
                }
                for c in list.iter() {
                    let x = (c.run)(*w);
                    if keep {
                        row(
                            &mut rows,
                            format!("{wname} {size} B"),
                            c.name,
                            c.peer,
                            two,
                            x,
                        );
                    }
                }
            }
        }
        for two in [false, true] {
            for m in &mix {
                let x = (m.run)(two, 500);
                if keep {
                    let w = if two {
                        "W5 request mix, 2 threads"
                    } else {
                        "W5 request mix, 1 thread"
                    };
                    row(&mut rows, w.to_string(), m.name, m.peer, two, Some(x));
                }
            }
        }
    }
    let mut csv = String::from("workload,contender,ns,vs_lower_bound,vs_best_peer\n");
    let mut workloads: Vec<String> = Vec::new();
    for r in &rows {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload.clone());
        }
    }
    for w in &workloads {
        let group: Vec<&Row> = rows.iter().filter(|r| &r.workload == w).collect();
        let lower = group
            .iter()
            .find(|r| r.name == "lower-bound")
            .map(|r| stat(r));
        let best = group
            .iter()
            .filter(|r| r.peer)
            .map(|r| stat(r))
            .fold(f64::INFINITY, f64::min);
        let unit = if w.starts_with("W5") {
            "ns/request"
        } else {
            "ns/object"
        };
        let how = if group[0].two_threads {
            "median"
        } else {
            "min"
        };
        println!("\n{w} ({how} of {rounds} interleaved samples, {unit})");
        println!("| contender | {unit} | vs lower bound | vs best peer |");
        println!("| --- | ---: | ---: | ---: |");
        for r in &group {
            let x = stat(r);
            let lb = lower.map_or("—".to_string(), |l| format!("{:.2}x", x / l));
            println!("| {} | {:.2} | {} | {:.2}x |", r.name, x, lb, x / best);
            let _ = writeln!(
                csv,
                "\"{w}\",{},{x:.3},{},{:.3}",
                r.name,
                lower.map_or(String::new(), |l| format!("{:.3}", x / l)),
                x / best
            );
        }
    }
    let _ = std::fs::create_dir_all("target");
    std::fs::write("target/peers.csv", csv).expect("write target/peers.csv");
}
