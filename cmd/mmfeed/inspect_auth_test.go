package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// TestInspectCredentials: `inspect --nats` against a server with users
// authenticates with --nats-user/--nats-password (then fails only for lack
// of the job's stream), and without them is refused by the server.
func TestInspectCredentials(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, NoLog: true, Users: []*server.User{{Username: "service", Password: "s3cret"}}})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	defer ns.Shutdown()
	sheet := filepath.Join(t.TempDir(), "sheet.png")
	base := []string{"inspect", "--nats", ns.ClientURL(), "--job", "nojob", "--out", sheet}
	for _, tc := range []struct {
		name, user, pass, want string
	}{
		{"anonymous", "", "", "Authorization Violation"},
		{"wrong password", "service", "nope", "Authorization Violation"},
		{"service user", "service", "s3cret", "nojob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := base
			if tc.user != "" {
				args = append(args[:len(args):len(args)], "--nats-user", tc.user, "--nats-password", tc.pass)
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) || tc.user == "service" && tc.pass == "s3cret" && strings.Contains(stderr.String(), "Authorization") {
				t.Errorf("exit %d, stderr %q; want a failure naming %q", code, stderr.String(), tc.want)
			}
		})
	}
}
