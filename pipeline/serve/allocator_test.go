package serve

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go"
)

// countingAllocator counts the allocations it passes on.
type countingAllocator struct {
	memory.Allocator
	n atomic.Int64
}

func (a *countingAllocator) Allocate(size int) []byte {
	a.n.Add(1)
	return a.Allocator.Allocate(size)
}

// TestAllocatorReleased: the service builds its records with
// Config.Allocator and releases every one of them: after a served epoch
// (with a viewer's copy of a step on the core data plane) nothing is left
// allocated, on both data planes.
func TestAllocatorReleased(t *testing.T) {
	input := corpus(t, 40)
	for _, plane := range []string{proto.DataPlaneCore, proto.DataPlaneJetStream} {
		t.Run(plane, func(t *testing.T) {
			checked := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer checked.AssertSize(t, 0)
			mem := &countingAllocator{Allocator: checked}
			cfg := testConfig(t, input, 2, 1, "colocated")
			cfg.DataPlane, cfg.Recalibrate, cfg.Allocator = plane, -1, mem
			r := start(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			trs := runTrainersPartial(t, ctx, cfg, r.s.ClientURL(), 1)
			if plane == proto.DataPlaneCore { // a viewer's copy of an acknowledged step is built with it too
				nc, err := nats.Connect(r.s.ClientURL())
				if err != nil {
					t.Fatal(err)
				}
				key := proto.BatchKey{Job: cfg.Job, Epoch: 0, Step: 0}
				if _, err := proto.ViewBatch(ctx, nc, key, 64<<20); err != nil {
					t.Fatalf("view %v: %v", key, err)
				}
				nc.Close()
			}
			errc := make(chan error, len(trs))
			for _, tr := range trs {
				go func() { errc <- tr.consume(ctx, 0, -1) }()
			}
			for range trs {
				if err := <-errc; err != nil {
					t.Fatalf("trainer: %v", err)
				}
			}
			if err := r.wait(t, 30*time.Second); err != nil {
				t.Fatalf("service: %v", err)
			}
			checkDelivery(t, cfg, trs, 0, shardExpectation(t, cfg, 0))
			if mem.n.Load() == 0 {
				t.Fatal("no record was built with Config.Allocator")
			}
		})
	}
}
