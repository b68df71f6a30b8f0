//! The process's global allocator: glibc's malloc (the system allocator), mimalloc, or,
//! in the build that links it (`cargo run --release -p proxalloc-tools --bin showdown`),
//! jemalloc.
//!
//! A server picks its global allocator at build time with `#[global_allocator]`. The
//! showdown compares them in fresh processes of one binary instead: [`Global`] reads
//! [`ENV`] at the first allocation (before `main`: the runtime allocates too) and never
//! changes its choice, so every block is freed by the allocator that made it. `--global
//! NAME` on the command line re-executes the program with the variable set
//! ([`ensure`]). The choice costs one relaxed load and a predictable branch per call,
//! the same in every mode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// The environment variable that names the global allocator: `glibc` (also when unset),
/// `mimalloc` or `jemalloc`.
pub const ENV: &str = match std::str::from_utf8(ENV_C.to_bytes()) {
    Ok(name) => name,
    Err(_) => panic!("an ASCII name"),
};
/// [`ENV`] for `getenv`.
const ENV_C: &CStr = c"SHOWDOWN_GLOBAL";

/// A global allocator the showdown can run under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The system allocator: glibc's malloc on Linux.
    Glibc = 0,
    Mimalloc = 1,
    Jemalloc = 2,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Glibc, Kind::Mimalloc, Kind::Jemalloc];

    /// The name on the command line and in [`ENV`].
    pub fn flag(self) -> &'static str {
        match self {
            Kind::Glibc => "glibc",
            Kind::Mimalloc => "mimalloc",
            Kind::Jemalloc => "jemalloc",
        }
    }

    pub fn parse(flag: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.flag() == flag)
    }

    fn from_u8(v: u8) -> Kind {
        Kind::ALL[usize::from(v)]
    }
}

/// The dispatching global allocator. `J` is jemalloc in the build that links it, and
/// [`NoJemalloc`] in the example (which keeps jemalloc's C build out of its first run).
pub struct Global<J> {
    jemalloc: Option<J>,
    /// A `Kind` as `u8`, or `UNDECIDED` until the first allocation.
    choice: AtomicU8,
}

const UNDECIDED: u8 = u8::MAX;

impl<J> Global<J> {
    pub const fn new(jemalloc: Option<J>) -> Self {
        Global {
            jemalloc,
            choice: AtomicU8::new(UNDECIDED),
        }
    }

    /// Whether this build can run under `kind`.
    pub fn has(&self, kind: Kind) -> bool {
        kind != Kind::Jemalloc || self.jemalloc.is_some()
    }

    /// The allocator this process runs under.
    pub fn current(&self) -> Kind {
        match self.choice.load(Relaxed) {
            UNDECIDED => self.decide(),
            v => Kind::from_u8(v),
        }
    }

    #[cold]
    fn decide(&self) -> Kind {
        // SAFETY: getenv with a NUL-terminated name; it allocates nothing. The first
        // allocation comes before `main` or in it before any thread starts, so nothing
        // sets the environment meanwhile; the string is read before anything could.
        let value = unsafe {
            let value = libc::getenv(ENV_C.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_bytes())
        };
        let kind = choose(value, self.jemalloc.is_some());
        // Threads that race here read the same variable; the first store wins for all.
        match self
            .choice
            .compare_exchange(UNDECIDED, kind as u8, Relaxed, Relaxed)
        {
            Ok(_) => kind,
            Err(v) => Kind::from_u8(v),
        }
    }
}

/// The allocator that [`ENV`]'s value names (`None`: unset), where this build has it;
/// glibc otherwise (a name this build lacks is reported by [`ensure`] once `main` runs).
pub fn choose(value: Option<&[u8]>, has_jemalloc: bool) -> Kind {
    match value {
        Some(b"mimalloc") => Kind::Mimalloc,
        Some(b"jemalloc") if has_jemalloc => Kind::Jemalloc,
        _ => Kind::Glibc,
    }
}

// SAFETY: every call goes to the allocator chosen before the first allocation, and the
// choice never changes afterwards, so a block is always freed, grown or shrunk by the
// allocator that made it; each call passes its caller's contract on unchanged.
unsafe impl<J: GlobalAlloc> GlobalAlloc for Global<J> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on (see the impl).
        unsafe {
            match (self.current(), &self.jemalloc) {
                (Kind::Mimalloc, _) => mimalloc::MiMalloc.alloc(layout),
                (Kind::Jemalloc, Some(j)) => j.alloc(layout),
                _ => System.alloc(layout),
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on (see the impl).
        unsafe {
            match (self.current(), &self.jemalloc) {
                (Kind::Mimalloc, _) => mimalloc::MiMalloc.alloc_zeroed(layout),
                (Kind::Jemalloc, Some(j)) => j.alloc_zeroed(layout),
                _ => System.alloc_zeroed(layout),
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on; `ptr` came from the same allocator
        // (see the impl).
        unsafe {
            match (self.current(), &self.jemalloc) {
                (Kind::Mimalloc, _) => mimalloc::MiMalloc.dealloc(ptr, layout),
                (Kind::Jemalloc, Some(j)) => j.dealloc(ptr, layout),
                _ => System.dealloc(ptr, layout),
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on; `ptr` came from the same allocator
        // (see the impl).
        unsafe {
            match (self.current(), &self.jemalloc) {
                (Kind::Mimalloc, _) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                (Kind::Jemalloc, Some(j)) => j.realloc(ptr, layout, new_size),
                _ => System.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// The example's stand-in for jemalloc: a type with no value, so `Global` never calls it.
#[allow(dead_code)] // unused in the tools build, which has jemalloc
pub enum NoJemalloc {}

// SAFETY: there is no value of `NoJemalloc`, so none of these can be called.
unsafe impl GlobalAlloc for NoJemalloc {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        match *self {}
    }

    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {
        match *self {}
    }
}

/// Gives proxalloc the call that returns `kind`'s free memory to the OS, for its trims
/// (`proxalloc::set_system_trim`): mimalloc's `mi_collect`. glibc's `malloc_trim` is
/// proxalloc's own default; jemalloc's purge is left to its own schedule here.
pub fn install_system_trim(kind: Kind) {
    if kind == Kind::Mimalloc {
        proxalloc::set_system_trim(Some(|| {
            // SAFETY: `mi_collect` has no preconditions (mimalloc is the global allocator
            // here, and its calls are thread-safe).
            unsafe { libmimalloc_sys::mi_collect(true) }
        }));
    }
}

/// Makes sure this process runs under `want`: if it does not (the variable was not set
/// before it started), runs the program again in this process with [`ENV`] set. Exits
/// with a message where this build has no `want`.
pub fn ensure<J>(global: &Global<J>, want: Kind) {
    if global.current() == want {
        return;
    }
    if !global.has(want) {
        eprintln!(
            "this build has no {}: `cargo run --release -p proxalloc-tools --bin showdown` has \
             (its first build compiles jemalloc's C code)",
            want.flag()
        );
        std::process::exit(2);
    }
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().expect("own path");
    let error = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(ENV, want.flag())
        .exec();
    eprintln!("cannot run again under {}: {error}", want.flag());
    std::process::exit(1);
}
