package serve

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/nats-io/nats.go"
)

// TestNATSTLS: the embedded server with a certificate from a CA the test
// generates (crypto/x509) refuses clients that do not trust that CA and
// serves trainers that do (with their rank credentials) every batch
// (natsenv's TestEmbeddedClientCertificates: a client CA too).
func TestNATSTLS(t *testing.T) {
	dir := t.TempDir()
	if err := natsenv.WriteTLS(dir, []string{"trainer-host.example"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, natsenv.TLSCAFile), filepath.Join(dir, natsenv.TLSServerCertFile), filepath.Join(dir, natsenv.TLSServerKeyFile)

	t.Run("server", func(t *testing.T) {
		cfg := testConfig(t, corpus(t, 40), 2, 1, "colocated")
		cfg.Recalibrate = -1
		conf, ids := writeAuth(t, cfg.Job, 2, 1)
		cfg.NATS.ServerConfig, cfg.NATS.ServerTLSCert, cfg.NATS.ServerTLSKey = conf, cert, key
		r := start(t, cfg)
		url := r.s.ClientURL()
		svc := nats.UserInfo(natsenv.ServiceUser, ids[natsenv.ServiceUser].Password)
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
			id := ids[natsenv.TrainerUser(tr.dp, tr.mp)]
			tr.natsOpts = []nats.Option{nats.UserInfo(id.User, id.Password), slowAuth, nats.RootCAs(ca)}
		})
		if err := r.wait(t, 30*time.Second); err != nil {
			t.Fatalf("service: %v", err)
		}
		checkDelivery(t, cfg, trs, 0, shardExpectation(t, cfg, 0))
	})
}
