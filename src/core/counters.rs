//! The statistics counters an allocator keeps, defined once: [`for_each_counter!`] names
//! each, and every place that carries counters is generated from it (a cache's
//! [`Counters`], their sums [`Counts`], the [`Stats`](crate::Stats) fields, the dump's
//! [`Row`](crate::stats::Row) columns, the metrics export, and so serde). Adding a
//! counter is one line in the list (and the code that bumps it).

use crate::sync::StatCounter;

/// Calls `$callback! { $($prefix)* <the list> }` with every counter, one entry each:
/// `[attributes] name "dump-column" "what it counts";`. The text is the `Stats` field's
/// doc, the row column's and the metric's help (`proxalloc_<name>_total`).
macro_rules! for_each_counter {
    ($callback:ident ! { $($prefix:tt)* }) => {
        $callback! { $($prefix)*
            allocs "allocs" "Objects handed to users.";
            frees "frees" "Objects given back by users.";
            refills "refills" "Full magazines a thread took from the depot.";
            spills "spills" "Full magazines a thread gave to the depot (and the depot kept).";
            overflows "overflows" "Magazines whose objects went to the backing allocator because the depot budget was full.";
            // Only the crate's own tests have it: the test that adding a counter takes
            // this one line (`src/tests/counters.rs`).
            #[cfg(test)] probe "probe" "A counter of the crate's own tests.";
        }
    };
}
pub(crate) use for_each_counter;

macro_rules! define_counters {
    ($($(#[$attr:meta])* $name:ident $column:literal $doc:literal;)*) => {
        /// Counters of one cache (or of all retired caches of an engine, and of the
        /// owners no thread owns): bumped by one thread at a time, read by any.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($(#[$attr])* #[doc = $doc] pub(crate) $name: StatCounter,)*
        }

        /// [`Counters`] read out as numbers.
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct Counts {
            $($(#[$attr])* #[doc = $doc] pub(crate) $name: u64,)*
        }

        impl Counters {
            pub(crate) const fn new() -> Self {
                Counters {
                    $($(#[$attr])* $name: StatCounter::new(),)*
                }
            }

            /// Zeroes the counters (the owner, for a cache no other thread can reach).
            pub(crate) fn reset(&self) {
                $($(#[$attr])* self.$name.reset();)*
            }

            /// Adds these counters' values to `sum`.
            pub(crate) fn read_into(&self, sum: &mut Counts) {
                $($(#[$attr])* { sum.$name += self.$name.get(); })*
            }

            /// Adds `other`'s values to these counters from any thread.
            pub(crate) fn add_shared(&self, other: &Counters) {
                let mut n = Counts::default();
                other.read_into(&mut n);
                $($(#[$attr])* self.$name.add_shared(n.$name);)*
            }
        }
    };
}
for_each_counter!(define_counters! {});

impl Counts {
    /// Operations: allocations plus frees (wrapping), what idleness is judged by.
    pub(crate) fn ops(&self) -> u64 {
        self.allocs.wrapping_add(self.frees)
    }
}

impl Counters {
    /// Operations (see [`Counts::ops`]), for the thread that bumps these counters.
    pub(crate) fn ops(&self) -> u64 {
        self.allocs.get().wrapping_add(self.frees.get())
    }
}

#[cfg(all(test, not(proxalloc_loom)))]
#[path = "tests/counters.rs"]
mod tests;
