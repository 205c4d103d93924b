package natsenv

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// slowAuth gives a connection time for the server's bcrypt check of its
// password on a loaded machine (nats.go's default is 2 s).
var slowAuth = nats.Timeout(20 * time.Second)

// writeAuth writes a job's identities as a NATS server configuration file
// and returns them by user name.
func writeAuth(t testing.TB, job string, dp, mp int) (string, map[string]Identity) {
	t.Helper()
	ids, err := JobIdentities(job, dp, mp)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := AuthConfig(ids)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	byUser := map[string]Identity{}
	for _, id := range ids {
		byUser[id.User] = id
	}
	return path, byUser
}

// TestEmbeddedAuthModes: whatever authentication the --nats-config file
// sets up (a users list, a single user, a token, client certificates
// only), the service's own in-process connection gets in, and a client
// with the configured credentials too, and an anonymous one does not.
func TestEmbeddedAuthModes(t *testing.T) {
	dir := t.TempDir()
	if err := WriteTLS(dir, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	users, ids := writeAuth(t, "job-1", 1, 1)
	tests := []struct {
		name, conf string
		tlsCA      bool
		client     []nats.Option
	}{
		{"users", "", false, []nats.Option{nats.UserInfo(TrainerUser(0, 0), ids[TrainerUser(0, 0)].Password), slowAuth}},
		{"single user", `authorization { user: alice, password: wonderland }`, false, []nats.Option{nats.UserInfo("alice", "wonderland")}},
		{"token", `authorization { token: "s3cret" }`, false, []nats.Option{nats.Token("s3cret")}},
		{"client certificates", "", true, []nats.Option{nats.ClientCert(filepath.Join(dir, TLSClientCertFile), filepath.Join(dir, TLSClientKeyFile))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), MaxPayload: 1 << 20, ReconnectWait: time.Second}
			switch {
			case tc.name == "users":
				cfg.ServerConfig = users
			case tc.conf != "":
				cfg.ServerConfig = filepath.Join(t.TempDir(), "nats.conf")
				if err := os.WriteFile(cfg.ServerConfig, []byte(tc.conf), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.tlsCA {
				cfg.ServerTLSCert, cfg.ServerTLSKey = filepath.Join(dir, TLSServerCertFile), filepath.Join(dir, TLSServerKeyFile)
				cfg.ServerTLSCA = filepath.Join(dir, TLSCAFile)
			}
			sec := &Security{ServicePass: "internal"}
			s, err := StartEmbedded(context.Background(), cfg, sec)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown()
			svc, err := Connect(cfg, s, sec, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatalf("service connection: %v", err)
			}
			defer svc.Close()
			if err := svc.Publish("mmfeed.job-1.ctl.done", nil); err != nil || svc.Flush() != nil {
				t.Fatalf("service publish: %v", err)
			}
			var trust []nats.Option
			if tc.tlsCA {
				trust = append(trust, nats.RootCAs(filepath.Join(dir, TLSCAFile)))
			}
			if c, err := nats.Connect(s.ClientURL(), append(trust, tc.client...)...); err != nil {
				t.Errorf("client with the configured credentials: %v", err)
			} else {
				c.Close()
			}
			if c, err := nats.Connect(s.ClientURL(), trust...); err == nil {
				c.Close()
				t.Error("anonymous client accepted")
			}
		})
	}
}
