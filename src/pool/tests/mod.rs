//! loom models of the pool's shared parts, built only by `--cfg proxalloc_loom` test
//! builds (see `.ci/run`).

mod loom_block_source;
