package natsenv

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestEmbeddedClientCertificates: the embedded server with a certificate
// from a CA WriteTLS generates and that CA as its client CA refuses clients
// without a certificate it signed and accepts one with it.
func TestEmbeddedClientCertificates(t *testing.T) {
	dir := t.TempDir()
	if err := WriteTLS(dir, []string{"trainer-host.example"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	ca, cert, key := filepath.Join(dir, TLSCAFile), filepath.Join(dir, TLSServerCertFile), filepath.Join(dir, TLSServerKeyFile)
	cliCert, cliKey := filepath.Join(dir, TLSClientCertFile), filepath.Join(dir, TLSClientKeyFile)
	nc := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), MaxPayload: 1 << 20,
		ServerTLSCert: cert, ServerTLSKey: key, ServerTLSCA: ca}
	s, err := StartEmbedded(context.Background(), nc, &Security{})
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
}
