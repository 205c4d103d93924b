package scalesim

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// repoBinaries returns bin/mmfeed and a nats-server, skipping the test when
// bin/mmfeed is not built (make test builds it; MMFEED_REQUIRE_PEERS makes
// that a failure).
func repoBinaries(t *testing.T) (string, string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "mmfeed")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("MMFEED_REQUIRE_PEERS") != "" {
			t.Fatalf("no %s (make build)", bin)
		}
		t.Skipf("no %s (make build)", bin)
	}
	nb, err := NATSBinary(root)
	if err != nil {
		t.Skip(err)
	}
	return bin, nb
}

// TestScale64 is the short version of `make scale`: 64 simulated ranks
// register at once against the real binary (planner + a worker) over a
// nats-server that is restarted under them mid-epoch; every sample is
// delivered exactly once per epoch, every rank receives again, and the
// control plane's KV writes stay within their per-step budget.
func TestScale64(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	bin, nb := repoBinaries(t)
	sc := &Scenario{Bin: bin, NATSBin: nb, Dir: t.TempDir(), N: 64, Servers: 1, Steps: 8, Epochs: 2, PerRank: 4,
		MicroBatches: 2, Workers: 1, RestartNATSAt: 4, KillLeaderAt: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := sc.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: %+v", f)
	if !f.Exact || f.Steps != 16 {
		t.Errorf("exact %v, steps %d: want true, 16", f.Exact, f.Steps)
	}
	if f.Reconnect <= 0 {
		t.Errorf("no rank received after the NATS restart")
	}
	// The handed steps and the positions of all ranks share their KV
	// writes (one write per rank and step each before: 1.0), and no
	// per-rank position key is written.
	for _, kind := range []string{"handed", "positions"} {
		if got := f.KVStepRank[kind]; got <= 0 || got > 0.5 {
			t.Errorf("%.2f %s KV writes per step and rank, want (0, 0.5]", got, kind)
		}
	}
	if f.AcksPerStepRank > 1 {
		t.Errorf("%.2f acks per step and rank, want one (of the step's last micro-batch)", f.AcksPerStepRank)
	}
	if got := f.KVStepRank["step"]; got != 0 {
		t.Errorf("%.2f rank.<dp>.<mp>.step KV writes per step and rank, want 0", got)
	}
}
