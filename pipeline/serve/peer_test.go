package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/internal/testpeer"

	"github.com/mmfeed/mmfeed/proto"
)

// TestPythonPeerTrains serves two epochs with modality placement to four
// nats-py trainer ranks (testdata/peer_trainer.py): each registers, pulls,
// reassembles, verifies, decodes with pyarrow, acks, reports, and registers
// for the next epoch until refused; the ids and columns each rank got must
// be the plan's.
func TestPythonPeerTrains(t *testing.T) {
	py := testpeer.Python(t)
	cfg := testConfig(t, corpus(t, 60), 2, 2, "modality")
	cfg.Epochs, cfg.Recalibrate = 2, -1
	cfg.DataPlane = proto.DataPlaneJetStream // the peer follows protocol section 9
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second) // the peers ask again while a loaded machine plans
	defer cancel()
	type line struct {
		Epoch, Step, MB int
		IDs             []string
		Weights         []float64
		Columns         []string
	}
	got := make([][]line, cfg.ranks())
	var wg sync.WaitGroup
	errs := make([]error, cfg.ranks())
	for rank := range cfg.ranks() {
		wg.Go(func() {
			dp, mp := rank/cfg.MP, rank%cfg.MP
			cmd := exec.CommandContext(ctx, py, "testdata/peer_trainer.py", r.s.ClientURL(), cfg.Job, "2", "2",
				fmt.Sprint(dp), fmt.Sprint(mp), "modality")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				errs[rank] = fmt.Errorf("rank %d.%d: %v\n%s", dp, mp, err, stderr.String())
				return
			}
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				var l line
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					errs[rank] = fmt.Errorf("rank %d.%d: %q: %v", dp, mp, sc.Text(), err)
					return
				}
				got[rank] = append(got[rank], l)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := r.wait(t, 30*time.Second); err != nil {
		t.Fatalf("service: %v", err)
	}
	for epoch := range 2 {
		ex := shardExpectation(t, cfg, epoch)
		for rank, lines := range got {
			dp, mp := rank/cfg.MP, rank%cfg.MP
			mod, _ := proto.ModalityFor("modality", 2, mp)
			n := 0
			for _, l := range lines {
				if l.Epoch != epoch {
					continue
				}
				n++
				want := ids(ex.rows[[3]int{l.Step, dp, l.MB}])
				if fmt.Sprint(l.IDs) != fmt.Sprint(want) {
					t.Errorf("rank %d.%d e%d s%d mb%d: ids %v, want %v", dp, mp, epoch, l.Step, l.MB, l.IDs, want)
				}
				if fmt.Sprint(l.Columns) != fmt.Sprint(mod.Columns()) {
					t.Errorf("rank %d.%d: columns %v, want %v", dp, mp, l.Columns, mod.Columns())
				}
			}
			if want := ex.steps * cfg.Pipeline.Plan.MicroBatches; n != want {
				t.Errorf("rank %d.%d: %d batches in epoch %d, want %d", dp, mp, n, epoch, want)
			}
		}
	}
}
