package serve

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestNATSTLS: the embedded server with a certificate from a CA the test
// generates (crypto/x509) refuses clients that do not trust that CA, serves
// trainers that do (with their rank credentials) every batch, and with a
// client CA also refuses clients without a certificate it signed.
func TestNATSTLS(t *testing.T) {
	dir := t.TempDir()
	if err := WriteTLS(dir, []string{"trainer-host.example"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, TLSCAFile), filepath.Join(dir, TLSServerCertFile), filepath.Join(dir, TLSServerKeyFile)
	cliCert, cliKey := filepath.Join(dir, TLSClientCertFile), filepath.Join(dir, TLSClientKeyFile)

	t.Run("server", func(t *testing.T) {
		cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
		cfg.Recalibrate = -1
		conf, ids := writeAuth(t, cfg.Job, 2, 1)
		cfg.NATS.ServerConfig, cfg.NATS.ServerTLSCert, cfg.NATS.ServerTLSKey = conf, cert, key
		r := start(t, cfg)
		url := r.s.ClientURL()
		svc := nats.UserInfo(ServiceUser, ids[ServiceUser].Password)
		if nc, err := nats.Connect(url, svc, slowAuth); err == nil {
			nc.Close()
			t.Fatal("connected over TLS without trusting the CA")
		}
		if nc, err := nats.Connect(url, svc, slowAuth, nats.RootCAs(ca)); err != nil {
			t.Fatalf("connect trusting the CA: %v", err)
		} else if !nc.TLSRequired() {
			t.Error("connection does not require TLS")
		} else {
			nc.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		trs := runTrainersWith(t, ctx, cfg, url, []int{0}, true, func(tr *trainer) {
			id := ids[TrainerUser(tr.dp, tr.mp)]
			tr.natsOpts = []nats.Option{nats.UserInfo(id.User, id.Password), slowAuth, nats.RootCAs(ca)}
		})
		if err := r.wait(t, 30*time.Second); err != nil {
			t.Fatalf("service: %v", err)
		}
		checkDelivery(t, cfg, trs, 0, shardExpectation(t, cfg, 0))
	})
	t.Run("client certificates", func(t *testing.T) {
		nc := NATSConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), MaxPayload: 1 << 20,
			ServerTLSCert: cert, ServerTLSKey: key, ServerTLSCA: ca}
		s, err := startEmbedded(nc, &embeddedSecurity{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown()
		if c, err := nats.Connect(s.ClientURL(), nats.RootCAs(ca)); err == nil {
			c.Close()
			t.Fatal("connected without a client certificate")
		}
		c, err := nats.Connect(s.ClientURL(), nats.RootCAs(ca), nats.ClientCert(cliCert, cliKey))
		if err != nil {
			t.Fatalf("connect with a client certificate: %v", err)
		}
		c.Close()
	})
}
