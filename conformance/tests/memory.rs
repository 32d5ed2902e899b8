//! The whole suite against the in-process reference backend.

conformance::suite!(conformance::MemoryHarness::new());
