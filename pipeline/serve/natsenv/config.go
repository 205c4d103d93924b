package natsenv

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Config selects and authenticates the NATS deployment.
type Config struct {
	// URLs of an existing NATS deployment (comma-separated in the CLI). Empty:
	// start the embedded server.
	URLs []string
	// User and Password, Token, NKeySeedFile or CredsFile authenticate to an
	// external deployment (at most one method).
	User, Password string
	Token          string
	NKeySeedFile   string
	CredsFile      string
	// TLSCA, TLSCert and TLSKey configure TLS to an external deployment.
	TLSCA, TLSCert, TLSKey string

	// ServerConfig is a NATS server configuration file the embedded server
	// loads first (authorization users and permissions, accounts, TLS, ...;
	// `mmfeed creds` writes one); the fields here override its listen
	// address, JetStream store, max_payload and server logging.
	ServerConfig string
	// ServerTLSCert and ServerTLSKey make the embedded server require TLS;
	// with ServerTLSCA it also requires client certificates signed by that
	// CA (which then authenticate clients).
	ServerTLSCert, ServerTLSKey, ServerTLSCA string

	// Listen is the embedded server's client address ("127.0.0.1:4222" in the
	// CLI). "" accepts in-process connections only; port 0 picks a free port.
	Listen string
	// DataDir holds the embedded server's JetStream file store ("mmfeed-data").
	DataDir string
	// MaxPayload is the embedded server's max_payload (8 MiB); larger payloads
	// mean fewer chunks.
	MaxPayload int32
	// ReconnectWait is the pause between reconnect attempts (250 ms).
	ReconnectWait time.Duration
}

// Validate checks every field.
func (n Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("serve: nats: "+format+": %w", append(a, ErrInvalidConfig)...)
	}
	methods := 0
	for _, set := range []bool{n.User != "" || n.Password != "", n.Token != "", n.NKeySeedFile != "", n.CredsFile != ""} {
		if set {
			methods++
		}
	}
	switch {
	case methods > 1:
		return bad("more than one authentication method")
	case (n.TLSCert == "") != (n.TLSKey == ""):
		return bad("a TLS client certificate needs both cert and key")
	case n.ReconnectWait <= 0:
		return bad("reconnect wait %v", n.ReconnectWait)
	}
	if n.External() {
		if n.ServerConfig != "" || n.ServerTLSCert != "" {
			return bad("server configuration and server TLS apply to the embedded server only")
		}
		return nil
	}
	if methods > 0 || n.TLSCA != "" || n.TLSCert != "" {
		return bad("authentication and TLS options apply to an external deployment (--nats URL) only")
	}
	if (n.ServerTLSCert == "") != (n.ServerTLSKey == "") || n.ServerTLSCA != "" && n.ServerTLSCert == "" {
		return bad("the embedded server's TLS needs a cert and a key (and a CA only with them)")
	}
	if n.DataDir == "" {
		return bad("the embedded server needs a data dir")
	}
	if n.MaxPayload < 64<<10 || n.MaxPayload > 64<<20 {
		return bad("max payload %d outside [64 KiB, 64 MiB]", n.MaxPayload)
	}
	if n.Listen != "" {
		_, port, err := net.SplitHostPort(n.Listen)
		if err != nil {
			return bad("listen address %q: %v", n.Listen, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return bad("listen port %q", port)
		}
	}
	return nil
}

// External reports whether the config names an existing deployment.
func (n Config) External() bool { return len(n.URLs) > 0 }
