package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
	natsserver "github.com/nats-io/nats-server/v2/server"
)

// `mmfeed shard --nats` with two workers writes the same files as a local
// `mmfeed shard`; an input URL is refused with --nats.
func TestShardNATS(t *testing.T) {
	dir := t.TempDir()
	mmfeed(t, "synth", "--out", filepath.Join(dir, "corpus"), "--samples", "80", "--seed", "2")
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	defer ns.Shutdown()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			errc <- work.RunWorker(ctx, work.WorkerConfig{NATS: natsenv.Config{URLs: []string{ns.ClientURL()}}, Slots: 1, CacheDir: t.TempDir()})
		}()
	}
	defer func() {
		cancel()
		for range 2 {
			if err := <-errc; err != nil {
				t.Errorf("worker: %v", err)
			}
		}
	}()
	args := []string{"shard", "--input", filepath.Join(dir, "corpus", "manifest.jsonl"), "--dp", "2", "--global-batch", "16",
		"--image-size", "32", "--workers", "2", "--epochs", "2", "--part-steps", "2"}
	local, remote := filepath.Join(dir, "local"), filepath.Join(dir, "remote")
	mmfeed(t, append(args, "--out", local)...)
	out := mmfeed(t, append(args, "--out", remote, "--nats", ns.ClientURL())...)
	if !strings.Contains(out, "80 samples seen") {
		t.Errorf("output %q", out)
	}
	want, got := files(t, local), files(t, remote)
	if len(want) < 8 || len(got) != len(want) {
		t.Errorf("%d files with --nats, %d local", len(got), len(want))
	}
	for name, b := range want {
		if !bytes.Equal(b, got[name]) {
			t.Errorf("%s differs", name)
		}
	}
	var o, e bytes.Buffer
	if code := run(context.Background(), append(args, "--out", filepath.Join(dir, "u"), "--nats", ns.ClientURL(), "--input", "s3://bucket/x.jsonl"), &o, &e); code == 0 ||
		!strings.Contains(e.String(), "URL inputs are not supported with --nats") {
		t.Errorf("URL input with --nats: exit %d, stderr %q", code, e.String())
	}
}

func files(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		m[strings.TrimPrefix(p, dir)] = b
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return m
}
