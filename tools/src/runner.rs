//! The interleaved runner: every round runs one sample of every cell (a contender on a
//! workload) in turn, so that the machine's changes of state (the shared 2-core box
//! switches between a fast and a slow state) hit all of them alike, and ratios are taken
//! within one run. Round 0 only warms up. A table then reports, per workload, the minimum
//! over the samples for single-thread work (the run least disturbed) and the median for
//! multi-thread work (whose spread comes from scheduling, not from the code), with the
//! ratio to a baseline row and, when the run has peers, to the best peer. Tables are
//! markdown; `--csv PATH` also writes them as CSV.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A run's command line: `[rounds] [--csv PATH] [--only NAME,..] [--tables TEXT,..]
/// [--spread]`, in any order. Other arguments are ignored: `cargo bench` passes `--bench` to every bench
/// binary.
pub struct Args {
    pub rounds: usize,
    /// Where to write the CSV. A relative path is taken from the workspace's root, not
    /// from the folder cargo runs a bench in (its package's, `tools/`).
    pub csv: Option<PathBuf>,
    /// `--only`: the contenders to run (all when absent). Fewer cells make shorter rounds,
    /// so more rounds fit while the machine is quiet; the ratios still come from one run.
    pub only: Option<Vec<String>>,
    /// `--tables`: run only the tables whose workload names contain one of these.
    pub tables: Option<Vec<String>>,
    /// `--spread`: also print each cell's percentiles, for the tables whose samples are
    /// spread by scheduling (a median over two modes says little on its own).
    pub spread: bool,
}

impl Args {
    pub fn parse(default_rounds: usize) -> Args {
        let mut args = std::env::args().skip(1);
        let mut rounds = None;
        let mut csv = None;
        let (mut only, mut tables, mut spread) = (None, None, false);
        let list = |s: Option<String>, flag: &str| -> Option<Vec<String>> {
            let s = s.unwrap_or_else(|| panic!("{flag} takes a comma-separated list"));
            Some(s.split(',').map(str::to_owned).collect())
        };
        while let Some(a) = args.next() {
            if a == "--csv" {
                csv = Some(workspace_path(args.next().expect("--csv PATH")));
            } else if a == "--only" {
                only = list(args.next(), "--only");
            } else if a == "--tables" {
                tables = list(args.next(), "--tables");
            } else if a == "--spread" {
                spread = true;
            } else if rounds.is_none() {
                rounds = a.parse().ok();
            }
        }
        Args {
            rounds: rounds.unwrap_or(default_rounds),
            csv,
            only,
            tables,
            spread,
        }
    }
}

/// `path` taken from the workspace's root where it is relative.
pub fn workspace_path(path: impl Into<PathBuf>) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path.into())
}

/// The workspace's build folder (`CARGO_TARGET_DIR`, else `target/`), where a run's
/// files go by default.
pub fn target_dir() -> PathBuf {
    workspace_path(std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into()))
}

/// Runs `f` and returns its wall time in nanoseconds per operation, for `ops` operations.
pub fn time_per(ops: f64, f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_nanos() as f64 / ops
}

/// How a table sums up a cell's samples.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stat {
    /// Single-thread work: the least disturbed sample.
    Min,
    /// Multi-thread work: the middle sample.
    Median,
}

impl Stat {
    fn of(self, samples: &[f64]) -> f64 {
        let s = sorted(samples);
        match self {
            Stat::Min => s[0],
            Stat::Median => percentile(&s, 50),
        }
    }

    fn word(self) -> &'static str {
        match self {
            Stat::Min => "min",
            Stat::Median => "median",
        }
    }
}

/// `samples` in ascending order.
fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// The `q`th percentile of `sorted` samples: the sample at `len * q / 100` (for 50, the
/// upper median of an even count).
fn percentile(sorted: &[f64], q: usize) -> f64 {
    sorted[(sorted.len() * q / 100).min(sorted.len() - 1)]
}

/// A table: the cells of one workload.
struct Table {
    workload: String,
    unit: &'static str,
    stat: Stat,
    /// The row the ratios are taken against.
    baseline: &'static str,
}

/// A table as printed: its rows (contender, figure), the baseline row's figure and the
/// best peer's.
struct Summary<'t> {
    table: &'t Table,
    rows: Vec<(&'static str, f64)>,
    base: Option<f64>,
    best_peer: Option<f64>,
}

/// A contender on a workload: `run` takes one sample, in the table's unit (`None` where
/// the workload does not apply to the contender: it gets no row).
struct Cell<'a> {
    table: usize,
    name: &'static str,
    peer: bool,
    run: Box<dyn FnMut() -> Option<f64> + 'a>,
    samples: Vec<f64>,
}

/// One interleaved run: tables, their cells, then `run`, then `report`.
pub struct Runner<'a> {
    /// The ratio column's heading after "vs " ("lower bound", "proxalloc").
    baseline_label: &'static str,
    tables: Vec<Table>,
    cells: Vec<Cell<'a>>,
    rounds: usize,
    /// `Args::only` and `Args::tables`: cells outside them are not added.
    only: Option<Vec<String>>,
    tables_wanted: Option<Vec<String>>,
}

/// A table's identity, for [`Runner::cell`].
#[derive(Clone, Copy)]
pub struct TableId(usize);

impl<'a> Runner<'a> {
    pub fn new(baseline_label: &'static str) -> Self {
        Runner {
            baseline_label,
            tables: Vec::new(),
            cells: Vec::new(),
            rounds: 0,
            only: None,
            tables_wanted: None,
        }
    }

    /// Keeps only the contenders and tables the command line names (`--only`,
    /// `--tables`); call before adding cells.
    pub fn restrict(&mut self, args: &Args) {
        self.only.clone_from(&args.only);
        self.tables_wanted.clone_from(&args.tables);
    }

    /// A table for `workload`, its samples in `unit`, summed up by `stat`, with ratios
    /// against the row called `baseline` ("—" where it has none).
    pub fn table(
        &mut self,
        workload: impl Into<String>,
        unit: &'static str,
        stat: Stat,
        baseline: &'static str,
    ) -> TableId {
        self.tables.push(Table {
            workload: workload.into(),
            unit,
            stat,
            baseline,
        });
        TableId(self.tables.len() - 1)
    }

    /// A cell of `table`. Cells run in the order they are added, every round.
    pub fn cell(
        &mut self,
        table: TableId,
        name: &'static str,
        peer: bool,
        run: impl FnMut() -> Option<f64> + 'a,
    ) {
        let listed = |list: &Option<Vec<String>>, f: &dyn Fn(&String) -> bool| {
            list.as_ref().is_none_or(|l| l.iter().any(f))
        };
        let workload = &self.tables[table.0].workload;
        if !listed(&self.only, &|n| n == name)
            || !listed(&self.tables_wanted, &|t| workload.contains(t.as_str()))
        {
            return;
        }
        self.cells.push(Cell {
            table: table.0,
            name,
            peer,
            run: Box::new(run),
            samples: Vec::new(),
        });
    }

    /// Round 0 (warm-up, not kept), then `rounds` rounds of one sample per cell.
    pub fn run(&mut self, rounds: usize) {
        self.rounds = rounds;
        for round in 0..=rounds {
            for c in &mut self.cells {
                if let Some(x) = (c.run)() {
                    if round > 0 {
                        c.samples.push(x);
                    }
                }
            }
        }
    }

    /// The cells of table `i` that have samples.
    fn sampled_cells(&self, i: usize) -> Vec<&Cell<'a>> {
        self.cells
            .iter()
            .filter(|c| c.table == i && !c.samples.is_empty())
            .collect()
    }

    /// Each table that has samples, summed up.
    fn summaries(&self) -> Vec<Summary<'_>> {
        let mut out = Vec::new();
        for (i, t) in self.tables.iter().enumerate() {
            let cells = self.sampled_cells(i);
            if cells.is_empty() {
                continue;
            }
            let rows: Vec<(&'static str, f64)> = cells
                .iter()
                .map(|c| (c.name, t.stat.of(&c.samples)))
                .collect();
            let base = rows.iter().find(|r| r.0 == t.baseline).map(|r| r.1);
            let best_peer = cells
                .iter()
                .zip(&rows)
                .filter(|(c, _)| c.peer)
                .map(|(_, r)| r.1)
                .reduce(f64::min);
            out.push(Summary {
                table: t,
                rows,
                base,
                best_peer,
            });
        }
        out
    }

    /// Whether any cell is a peer (then the tables have a "vs best peer" column).
    fn has_peers(&self) -> bool {
        self.cells.iter().any(|c| c.peer)
    }

    /// The tables, as markdown, on stdout.
    fn print(&self) {
        let peers = self.has_peers();
        for Summary {
            table: t,
            rows,
            base,
            best_peer,
        } in self.summaries()
        {
            let mut columns = vec!["contender", t.unit];
            let vs = format!("vs {}", self.baseline_label);
            columns.push(&vs);
            if peers {
                columns.push("vs best peer");
            }
            println!(
                "\n{} ({} of {} interleaved samples, {})",
                t.workload,
                t.stat.word(),
                self.rounds,
                t.unit
            );
            print!("{}", header(&columns));
            for (name, x) in rows {
                let ratio =
                    |of: Option<f64>| of.map_or("—".to_string(), |b| format!("{:.2}x", x / b));
                print!("| {name} | {x:.2} | {}", ratio(base));
                if peers {
                    print!(" | {}", ratio(best_peer));
                }
                println!(" |");
            }
        }
    }

    /// The tables as CSV: `workload,contender,ns,vs_<baseline>,vs_best_peer` (a ratio
    /// left empty where its row is missing).
    pub fn csv(&self) -> String {
        let mut csv = format!(
            "workload,contender,ns,vs_{},vs_best_peer\n",
            self.baseline_label.replace(' ', "_")
        );
        for Summary {
            table: t,
            rows,
            base,
            best_peer,
        } in self.summaries()
        {
            for (name, x) in rows {
                let ratio = |of: Option<f64>| of.map_or(String::new(), |b| format!("{:.3}", x / b));
                let _ = writeln!(
                    csv,
                    "\"{}\",{name},{x:.3},{},{}",
                    t.workload,
                    ratio(base),
                    ratio(best_peer)
                );
            }
        }
        csv
    }

    /// The end of every run: the tables on stdout, and as CSV where `args` asks.
    pub fn report(&self, args: &Args) {
        self.print();
        if args.spread {
            self.print_spread();
        }
        if let Some(path) = &args.csv {
            self.write_csv(path);
        }
    }

    /// Each cell's samples at the 10th, 25th, 50th, 75th and 90th percentiles (see
    /// [`percentile`]; the 50th is [`Stat::Median`]'s).
    fn print_spread(&self) {
        for (i, t) in self.tables.iter().enumerate() {
            let cells = self.sampled_cells(i);
            if cells.is_empty() {
                continue;
            }
            println!("\n{} (spread of the samples, {})", t.workload, t.unit);
            print!(
                "{}",
                header(&["contender", "p10", "p25", "p50", "p75", "p90"])
            );
            for c in cells {
                let s = sorted(&c.samples);
                print!("| {} |", c.name);
                for q in [10, 25, 50, 75, 90] {
                    print!(" {:.2} |", percentile(&s, q));
                }
                println!();
            }
        }
    }

    /// Writes [`Runner::csv`] to `path`, creating its folder.
    fn write_csv(&self, path: &Path) {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(path, self.csv())
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// A markdown table's heading: the first column left-aligned, the figures right-aligned.
pub fn header(columns: &[&str]) -> String {
    let mut s = format!("| {} |\n| --- |", columns.join(" | "));
    for _ in 1..columns.len() {
        s.push_str(" ---: |");
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose cells return fixed figures: the tables' statistics, ratios and CSV
    /// (the format `target/peers.csv` has always had) without timing anything.
    #[test]
    fn tables_and_csv() {
        let mut run = Runner::new("lower bound");
        let single = run.table("W1 pair 64 B", "ns/object", Stat::Min, "lower-bound");
        let multi = run.table(
            "W4 remote free 64 B",
            "ns/object",
            Stat::Median,
            "lower-bound",
        );
        let mut x = 0.0;
        run.cell(single, "lower-bound", false, || Some(2.0));
        run.cell(single, "proxalloc", false, move || {
            x += 1.0;
            Some(2.0 + x) // 3, 4, 5: the minimum kept is 4 (3 is the warm-up)
        });
        run.cell(single, "jemalloc", true, || Some(8.0));
        run.cell(multi, "lower-bound", false, || None);
        let mut y = 0.0;
        run.cell(multi, "proxalloc", false, move || {
            y += 10.0;
            Some(y) // warm-up 10, then 20, 30, 40: median 30
        });
        run.cell(multi, "jemalloc", true, || Some(60.0));
        run.run(3);
        assert_eq!(
            run.csv(),
            "workload,contender,ns,vs_lower_bound,vs_best_peer\n\
             \"W1 pair 64 B\",lower-bound,2.000,1.000,0.250\n\
             \"W1 pair 64 B\",proxalloc,4.000,2.000,0.500\n\
             \"W1 pair 64 B\",jemalloc,8.000,4.000,1.000\n\
             \"W4 remote free 64 B\",proxalloc,30.000,,0.500\n\
             \"W4 remote free 64 B\",jemalloc,60.000,,1.000\n"
        );
    }

    #[test]
    fn markdown_header() {
        assert_eq!(
            header(&["contender", "ns/op", "vs x"]),
            "| contender | ns/op | vs x |\n| --- | ---: | ---: |\n"
        );
    }
}
