package serve

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startEmbedded starts the in-process JetStream server: file store under
// DataDir, loopback or in-process only unless Listen names another host.
// Its max_pending (what it queues for one client before dropping it as a
// slow consumer) is at least 8 messages of max_payload, so that a trainer's
// pull of a few chunks never exceeds it.
func startEmbedded(cfg NATSConfig) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "mmfeed", JetStream: true, StoreDir: filepath.Join(cfg.DataDir, "jetstream"),
		NoSigs: true, NoLog: true, MaxPayload: cfg.MaxPayload, DontListen: cfg.Listen == "",
		MaxPending: max(server.MAX_PENDING_SIZE, 8*int64(cfg.MaxPayload)), Host: "127.0.0.1", Port: -1,
	}
	if cfg.Listen != "" {
		host, port, _ := net.SplitHostPort(cfg.Listen)
		p, _ := strconv.Atoi(port)
		if p == 0 {
			p = -1 // nats-server: -1 is a random port
		}
		if host == "" {
			host = "127.0.0.1"
		}
		opts.Host, opts.Port = host, p
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("serve: embedded nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("serve: embedded nats server not ready after 30s")
	}
	return s, nil
}

// connect opens the service's connection: in-process to the embedded server,
// or to the external URLs with the configured authentication and TLS. It
// reconnects forever; disconnects and reconnects are logged.
func connect(cfg NATSConfig, embedded *server.Server, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("mmfeed-serve"), nats.MaxReconnects(-1), nats.ReconnectWait(cfg.ReconnectWait),
		nats.RetryOnFailedConnect(false), nats.ReconnectBufSize(64 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own close
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
	}
	url := ""
	if embedded != nil {
		opts = append(opts, nats.InProcessServer(embedded))
	} else {
		url = strings.Join(cfg.URLs, ",")
		auth, err := authOptions(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, auth...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("serve: connect to nats %s: %w", redact(url), err)
	}
	return nc, nil
}

func authOptions(cfg NATSConfig) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case cfg.User != "" || cfg.Password != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("serve: nkey seed %s: %w", cfg.NKeySeedFile, err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	return opts, nil
}

// redact drops user info from URLs for messages.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if sch := strings.Index(u, "://"); sch >= 0 && sch < at {
				parts[i] = u[:sch+3] + "***" + u[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}
