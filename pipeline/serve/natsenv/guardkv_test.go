package natsenv

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mmfeed/mmfeed/internal/testnats"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStorageCause: a failed state write is blamed on the embedded
// server's storage (ErrStorageFull, the write's own error kept) only when
// the server turned its JetStream off or its data directory is full; an
// answer about a key, an external server (none to look at) and a healthy
// one leave the error as it is. The full disk itself is TestFullDataDir's
// (serve, root only).
func TestStorageCause(t *testing.T) {
	ns := testnats.Server(t, testnats.Options{})
	dir := t.TempDir()
	failed := errors.New("context deadline exceeded")
	if err := StorageCause(ns, dir, nil); err != nil {
		t.Errorf("no error: %v", err)
	}
	if err := StorageCause(ns, dir, failed); err != failed {
		t.Errorf("healthy server: %v, want the write's error unchanged", err)
	}
	if err := StorageCause(nil, dir, failed); err != failed {
		t.Errorf("external server: %v, want the write's error unchanged", err)
	}
	if err := ns.DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	for _, answer := range []error{fmt.Errorf("create: %w", jetstream.ErrKeyExists), jetstream.ErrKeyNotFound} {
		if err := StorageCause(ns, dir, answer); err != answer || !IsKeyAnswer(answer) {
			t.Errorf("an answer about the key: %v, want it unchanged", err)
		}
	}
	full := StorageCause(ns, dir, failed)
	if !errors.Is(full, ErrStorageFull) || !errors.Is(full, failed) {
		t.Fatalf("JetStream off: %v, want ErrStorageFull and the write's error", full)
	}
	if err := StorageCause(ns, dir, full); err != full {
		t.Errorf("named twice: %v", err)
	}
}
