"""The deterministic simulator: the real shardsink code run on a simulated world, one seeded
schedule at a time (``make sim``; docs/architecture.md, "The simulator").

* :mod:`.store`: the in-memory store with S3's semantics, the simulated clock, the four outcomes;
* :mod:`.harness`: what is injected into the library while a schedule runs (store, clock,
  randomness, inline thread pools, per-actor process memory), and taken back after;
* :mod:`.tape`, :mod:`.sched`: one tape of choices per schedule; the baton scheduler running the
  actors one at a time, with crash points, faults and clock ticks at every store request;
* :mod:`.ctx`, :mod:`.runs`, :mod:`.sources`, :mod:`.maint`, :mod:`.landing`, :mod:`.zone_slot`:
  the actors (DAG runs' tasks, maintenance, readers, the landing zone's producer) and the world's
  sources and write slots;
* :mod:`.check`, :mod:`.final`: the invariants after every step and at the end;
* :mod:`.world`: one schedule from its seed; :mod:`.shrink`: the minimizer; :mod:`.planted`:
  fixed defects re-introduced behind a test-only switch; :mod:`.__main__`: the command line.

Development only: never installed, never imported by the library.
"""
