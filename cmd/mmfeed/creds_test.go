package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestCreds: `mmfeed creds` writes a NATS configuration the server loads
// (one user per identity, bcrypt hashes, not the passwords), one owner-only
// password file per identity, TLS files on request, and refuses to
// overwrite them without --force.
func TestCreds(t *testing.T) {
	out := filepath.Join(t.TempDir(), "creds")
	args := []string{"creds", "--job", "demo", "--dp", "2", "--mp", "2", "--out", out, "--tls-hosts", "feeder.internal"}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	opts, err := server.ProcessConfigFile(filepath.Join(out, authConfFile))
	if err != nil {
		t.Fatalf("auth.conf does not load: %v", err)
	}
	var users []string
	for _, u := range opts.Users {
		users = append(users, u.Username)
		pw, err := os.ReadFile(filepath.Join(out, u.Username+".pass"))
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(filepath.Join(out, u.Username+".pass")); st.Mode().Perm() != 0o600 {
			t.Errorf("%s.pass mode %v, want 0600", u.Username, st.Mode().Perm())
		}
		if !strings.HasPrefix(u.Password, "$2a$") || strings.Contains(u.Password, strings.TrimSpace(string(pw))) {
			t.Errorf("%s: password in auth.conf is not a bcrypt hash", u.Username)
		}
	}
	if got, want := strings.Join(users, ","), "service,worker,viewer,trainer-0-0,trainer-0-1,trainer-1-0,trainer-1-1"; got != want {
		t.Errorf("users: got %s, want %s", got, want)
	}
	for _, f := range []string{"ca.pem", "server-cert.pem", "server-key.pem", "client-cert.pem", "client-key.pem"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("tls file: %v", err)
		}
	}
	stderr.Reset()
	if code := run(context.Background(), args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "--force") {
		t.Errorf("second run: exit %d, %q; want a refusal naming --force", code, stderr.String())
	}
}
