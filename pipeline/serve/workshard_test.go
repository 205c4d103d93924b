package serve

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	natsserver "github.com/nats-io/nats-server/v2/server"
)

// `mmfeed shard --nats` in-process: an embedded NATS server, two workers
// (worker a is killed in the middle of its third item, after building its
// rows; worker b joins after a's second item and takes a's item over), and
// ShardWorkers as the shard writer's step source. Every file the run writes
// (data files, indexes, manifest, progress records) is byte-identical to a
// local Shard of the same inputs, every row written (extra.arrow's too) was
// built by the workers, and the quarantine has the same samples.
func TestShardWithWorkersEqualsLocal(t *testing.T) {
	input := corpus(t, 120)
	pc := testConfig(t, input, 2, 1, "colocated").Pipeline
	o := pipeline.DefaultShardOptions()
	o.Epochs, o.PartSteps = 2, 4
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	localDir, localQ, _ := shardLocal(t, ctx, pc, o, nil)

	ns := embeddedNATS(t)
	var aDone atomic.Int32
	var killedItem atomic.Value
	bJoin := make(chan struct{})
	var bItems sync.Map
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	startWorker := func(name string, hook func(*work.BatchItem) error) chan error {
		errc := make(chan error, 1)
		wc := work.WorkerConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Slots: 1, CacheDir: t.TempDir(),
			Logger: testLogger(t).With("worker", name), BeforeSend: hook}
		go func() { errc <- work.RunWorker(wctx, wc) }()
		return errc
	}
	aErr := startWorker("a", func(it *work.BatchItem) error {
		switch aDone.Add(1) {
		case 2:
			close(bJoin)
		case 3:
			killedItem.Store(it.ID)
			return work.ErrKilled
		}
		return nil
	})
	bErr := make(chan error, 1)
	go func() {
		select {
		case <-bJoin:
			bErr <- <-startWorker("b", func(it *work.BatchItem) error { bItems.Store(it.ID, true); return nil })
		case <-wctx.Done():
			bErr <- nil
		}
	}()
	fromWorkers := 0 // rows the workers built
	remoteDir, remoteQ, written := shardLocal(t, ctx, pc, o, func(prep *pipeline.Prepared) pipeline.StepSource {
		sw, err := work.NewShardWorkers(ctx, work.ShardWorkConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}},
			AckWait: 400 * time.Millisecond, Logger: testLogger(t)}, prep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := sw.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
		return func(ctx context.Context, plan *balancer.Plan, emit func(pipeline.StepBatch) error) error {
			return sw.Run(ctx, plan, func(sb pipeline.StepBatch) error {
				for _, mbs := range sb.Rows {
					for _, rows := range mbs {
						fromWorkers += len(rows)
					}
				}
				return emit(sb)
			})
		}
	})
	if fromWorkers != written {
		t.Errorf("the workers built %d rows, the files hold %d (extra.arrow included)", fromWorkers, written)
	}
	if err := <-aErr; !errors.Is(err, work.ErrKilled) {
		t.Fatalf("worker a: %v, want killed", err)
	}
	id, _ := killedItem.Load().(string)
	if _, ok := bItems.Load(id); id == "" || !ok {
		t.Errorf("worker b never took the item worker a died on (%q)", id)
	}
	stopWorkers()
	if err := <-bErr; err != nil {
		t.Errorf("worker b: %v", err)
	}

	local, remote := readTree(t, localDir), readTree(t, remoteDir)
	if len(local) < 5 {
		t.Fatalf("local shard wrote only %d files", len(local))
	}
	for name, b := range local {
		if rb, ok := remote[name]; !ok {
			t.Errorf("%s: missing from the shard --nats output", name)
		} else if !bytes.Equal(b, rb) {
			t.Errorf("%s: differs (%d bytes local, %d with workers)", name, len(b), len(rb))
		}
	}
	for name := range remote {
		if _, ok := local[name]; !ok {
			t.Errorf("%s: written only by shard --nats", name)
		}
	}
	if localQ.Total() == 0 || localQ.Total() != remoteQ.Total() {
		t.Errorf("quarantined %d locally, %d with workers (want equal, > 0)", localQ.Total(), remoteQ.Total())
	}
}

// shardLocal prepares and plans pc and shards it into a new folder, with
// the rows from src(prep) when src is not nil; it returns the folder and
// the run's quarantine.
func shardLocal(t *testing.T, ctx context.Context, pc pipeline.Config, o pipeline.ShardOptions,
	src func(*pipeline.Prepared) pipeline.StepSource) (string, interface{ Total() int64 }, int) {
	t.Helper()
	var q bytes.Buffer
	prep, err := pipeline.Prepare(ctx, pc, &q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prep.Close() })
	plan, err := prep.Plan(pc.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := pipeline.OpenStore(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var s pipeline.StepSource
	if src != nil {
		s = src(prep)
	}
	sum, err := pipeline.ShardFrom(ctx, prep, plan, st, o, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rows == 0 {
		t.Fatal("no rows written")
	}
	if len(sum.Epochs) < 2 || !hasExtra(sum.Files) {
		t.Fatalf("no later epoch or no extra.arrow to test: %+v", sum)
	}
	return dir, prep.Quarantine, sum.Rows
}

func hasExtra(files []string) bool {
	for _, f := range files {
		if f == "extra.arrow" {
			return true
		}
	}
	return false
}

// readTree returns every file under dir by its relative path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// embeddedNATS starts a JetStream server on a free loopback port.
func embeddedNATS(t *testing.T) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(ns.Shutdown)
	return ns
}
