package natsenv

import (
	"errors"
	"testing"
)

// TestEmbeddedListenNeedsAuth: a non-loopback NATS listener without
// authentication is refused unless Insecure; with users it is allowed.
func TestEmbeddedListenNeedsAuth(t *testing.T) {
	conf, _ := writeAuth(t, "job-1", 1, 1)
	tests := []struct {
		name     string
		listen   string
		conf     string
		insecure bool
		want     error
	}{
		{"loopback", "127.0.0.1:0", "", false, nil},
		{"localhost", "localhost:0", "", false, nil},
		{"in-process", "", "", false, nil},
		{"every address", "0.0.0.0:0", "", false, ErrInsecure},
		{"every address, insecure", "0.0.0.0:0", "", true, nil},
		{"every address, users", "0.0.0.0:0", conf, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nc := Config{Listen: tc.listen, ServerConfig: tc.conf, DataDir: t.TempDir(), MaxPayload: 1 << 20}
			_, err := embeddedOptions(nc, &Security{Insecure: tc.insecure})
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	got := Redact("nats://user:pw@host:4222,tls://h2:4222")
	if want := "nats://***@host:4222,tls://h2:4222"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
