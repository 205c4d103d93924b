package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestCredsNeverFollowsPlantedLinks: a link planted in --out under a
// credential's name is never written through (its target keeps its bytes),
// without --force the run refuses, with --force the link itself is replaced
// by a new file; a planted regular file never keeps its mode: every password
// and key file is created 0600, certificates 0644, each with O_EXCL.
func TestCredsNeverFollowsPlantedLinks(t *testing.T) {
	for _, c := range []struct {
		name    string
		planted string // file name in --out
		link    bool   // a link to a file outside, else a 0644 file
		force   bool
		wantOK  bool
	}{
		{"link to a password", "service.pass", true, false, false},
		{"link to a password, --force", "service.pass", true, true, true},
		{"link to auth.conf, --force", "auth.conf", true, true, true},
		{"link to a key, --force", "server-key.pem", true, true, true},
		{"link to the CA", "ca.pem", true, false, false},
		{"link to the CA, --force", "ca.pem", true, true, true},
		{"0644 password file", "worker.pass", false, false, false},
		{"0644 password file, --force", "worker.pass", false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out, secret := filepath.Join(dir, "creds"), filepath.Join(dir, "victim")
			must(t, os.MkdirAll(out, 0o700))
			must(t, os.WriteFile(secret, []byte("keep me"), 0o644))
			planted := filepath.Join(out, c.planted)
			if c.link {
				must(t, os.Symlink(secret, planted))
			} else {
				must(t, os.WriteFile(planted, []byte("old"), 0o644))
				must(t, os.Chmod(planted, 0o644))
			}
			args := []string{"creds", "--job", "demo", "--dp", "1", "--out", out, "--tls-hosts", "feeder.internal"}
			if c.force {
				args = append(args, "--force")
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			if got, _ := os.ReadFile(secret); string(got) != "keep me" {
				t.Errorf("the link's target was written: %q", got)
			}
			if (code == 0) != c.wantOK {
				t.Fatalf("exit %d (%s), want success %v", code, stderr.String(), c.wantOK)
			}
			if !c.wantOK {
				if !strings.Contains(stderr.String(), "exists") {
					t.Errorf("refusal %q does not say the file exists", stderr.String())
				}
				return
			}
			for _, f := range append([]string{"auth.conf", "service.pass", "worker.pass", "viewer.pass", "trainer-0-0.pass"}, tlsFiles...) {
				fi, err := os.Lstat(filepath.Join(out, f))
				must(t, err)
				want := os.FileMode(0o600)
				if strings.HasSuffix(f, "ca.pem") || strings.HasSuffix(f, "cert.pem") {
					want = 0o644 &^ umask()
				}
				if !fi.Mode().IsRegular() || fi.Mode().Perm() != want {
					t.Errorf("%s: mode %v, want a regular file %v", f, fi.Mode(), want)
				}
			}
		})
	}
}

// umask returns the process's file mode creation mask.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
