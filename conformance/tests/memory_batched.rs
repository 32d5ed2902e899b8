//! The whole suite against the reference backend with refresh batches on: every guard's
//! refreshes go through the locker's shared `refresh_many` queue and grid.

conformance::suite!(conformance::MemoryHarness::batched());
