"""The side-by-side benchmarks of bench/run.py, one concern a module:
options (the command line), console (messages and the two ways out),
session (the bench's folder and every process it starts), servers
(PostgreSQL, Kafka, saga-broker), ledgers (a run's copy of the ledger),
measure (figures from /proc, pgbench and the ledgers), results, budget,
runs (the phases), machine and report."""
