// Package scalesim is the control-plane scale harness of docs/BENCHMARKS.md
// ("Control plane at scale (issue 21)"): it runs N simulated trainer ranks
// in one process against a real `mmfeed serve` (bin/mmfeed, planner and
// workers as separate processes) over real NATS, and measures what the
// control plane costs per rank and per step.
//
// # Simulated ranks
//
// Each rank (rank.go) has its own NATS connection with the rank's inbox
// prefix and speaks the wire protocol as the Python client
// (trainer/mmfeed_trainer/data/stream/) does on the core data plane: it
// registers on its rank control subject (retrying while the service is
// starting or planning), asks for a window of 4 batches ahead (proto.Fetcher:
// the same fetch, re-ask and reassembly rules), and after each step publishes
// one ack of its last micro-batch (no reply) and a feedback, and a done after an
// epoch's last step; after a reconnect it sends the acks and dones of the
// last 30 s again. With Config.Barrier the ranks meet after every step, as
// the all-reduce makes real ranks do. Every delivered row of weight > 0 is
// counted per epoch, so Result.Check proves every sample of the corpus was
// delivered exactly once per epoch.
//
// # Harness
//
// Scenario (scenario.go) builds a corpus with `mmfeed synth`, starts NATS
// (nats-server processes, one or a 3-server cluster; natsproc.go), a planner
// (and a standby), workers, runs the ranks and samples the processes' CPU
// and RSS from /proc; it counts the job bucket's KV writes by key kind on a
// plain subscription to $KV.mmfeed_<job>.>. Events (a NATS restart, a kill -9
// of the leading planner) are injected at a step and timed to the moment
// every rank receives again.
//
// Ownership and concurrency: Run and Scenario.Run own everything they start
// and stop it before they return; a Result is read after Run returns.
// Linux only (/proc).
package scalesim
