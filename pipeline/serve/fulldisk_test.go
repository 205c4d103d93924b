package serve

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// smallDisk mounts a tmpfs of size bytes for the test (root only: skipped
// elsewhere) and returns its path.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes to dir until its file system is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, n)
		for {
			if _, err := f.Write(buf); err != nil {
				break // ENOSPC
			}
		}
	}
}

// TestFullDataDir fills the embedded server's --data-dir mid-epoch. The
// service names the cause (ENOSPC, the bytes free) instead of "context
// deadline exceeded", /healthz answers 503 with it, the failures are
// counted, no ack is answered once the position cannot be recorded, and
// after GiveUpAfter the service stops with ErrStorageFull. Before, /healthz
// answered 200 while every position write timed out.
func TestFullDataDir(t *testing.T) {
	disk := smallDisk(t, "24m")
	cfg := testConfig(t, corpus(t, 240), 1, 1, "colocated")
	cfg.Recalibrate = -1
	cfg.NATS.DataDir = filepath.Join(disk, "data")
	cfg.StreamMemory = false // the job's state on the file store, as `mmfeed serve` keeps it
	cfg.GiveUpAfter, cfg.AssetCheck = 4*time.Second, 200*time.Millisecond
	r := start(t, cfg)
	tr := newTrainer(t, cfg, r.s.ClientURL(), 0, 0)
	tr.stepDelay = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() { _ = tr.runEpoch(ctx, 0, -1) }()
	defer tr.crash()
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := counter(t, r.s, "mmfeed_serve_batches_total"); n < 2 {
			return errorf("%v batches published", n)
		}
		return nil
	})
	fill(t, disk)
	healthz := func() (int, string) {
		w := httptest.NewRecorder()
		r.s.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
		return w.Code, w.Body.String()
	}
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if code, body := healthz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "no space left on device (ENOSPC)") {
			return errorf("/healthz %d %q, want 503 naming ENOSPC", code, body)
		}
		return nil
	})
	if n := counter(t, r.s, "mmfeed_serve_state_write_failures_total"); n < 1 {
		t.Errorf("state write failures %v, want counted", n)
	}
	acked := len(tr.applied)
	err := r.wait(t, 30*time.Second)
	if !errors.Is(err, ErrStorageFull) || !strings.Contains(err.Error(), "bytes free") {
		t.Fatalf("service on a full disk: %v, want ErrStorageFull naming the space left", err)
	}
	t.Logf("stopped: %v (%d batches applied before)", err, acked)
}
