package natsenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Security is what the service adds to the embedded server's
// options: whether a non-loopback listener without authentication is
// allowed, and the password of the service's own in-process user, added
// when the configuration has users. embeddedOptions fills in how the
// service then connects (token or user).
type Security struct {
	Insecure    bool   // a non-loopback listener without authentication is allowed
	ServicePass string // the service's own user's password (RandomSecret)
	token       string // the configured token: the service connects with it
	asUser      bool   // the service connects as internalUser with servicePass
}

// PerUser reports whether the service connects as its own user of an
// embedded server with per-user permissions (each credential's inbox is
// scoped; replies must go there). False for a nil Security.
func (sec *Security) PerUser() bool { return sec != nil && sec.asUser }

// internalUser is the service's own user on an embedded server that
// authenticates clients (its password is random per start).
const internalUser = "mmfeed-serve-internal"

// StartEmbedded starts the in-process JetStream server: file store under
// DataDir, loopback or in-process only unless Listen names another host.
// Its max_pending (what it queues for one client before dropping it as a
// slow consumer) is at least 8 messages of max_payload, so that a trainer's
// pull of a few chunks never exceeds it. ServerConfig (users, permissions,
// TLS, ...) and the ServerTLS fields apply; a listener on a non-loopback
// address without authentication is refused (ErrInsecure) unless
// sec.Insecure. It waits up to 30 s for the server to accept connections,
// and no longer than ctx: when ctx ends first the server is shut down and
// the error wraps ctx's.
func StartEmbedded(ctx context.Context, cfg Config, sec *Security) (*server.Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("serve: embedded nats server: %w", err)
	}
	opts, err := embeddedOptions(cfg, sec)
	if err != nil {
		return nil, err
	}
	if err := portFree(opts.Host, opts.Port); err != nil {
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("serve: embedded nats server: %w", err)
	}
	go s.Start()
	if err := awaitReady(ctx, s, 30*time.Second); err != nil {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, err
	}
	return s, nil
}

// readyPoll is how often awaitReady looks at ctx while the server starts.
const readyPoll = 50 * time.Millisecond

// awaitReady waits until s accepts connections, for at most limit and no
// longer than ctx.
func awaitReady(ctx context.Context, s *server.Server, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !s.ReadyForConnections(min(readyPoll, time.Until(deadline))) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("serve: embedded nats server: %w", err)
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("serve: embedded nats server not ready after %v", limit)
		}
	}
	return nil
}

// portFree says so when the embedded server's fixed listen port is taken
// (the server itself only reports that it is not ready after 30 s).
func portFree(host string, port int) error {
	if port <= 0 {
		return nil
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("serve: nats listen %s: the port is already in use (another mmfeed serve or nats-server?): choose another --nats-listen: %w", addr, ErrInvalidConfig)
		}
		return fmt.Errorf("serve: nats listen %s: %w", addr, err)
	}
	return ln.Close()
}

func embeddedOptions(cfg Config, sec *Security) (*server.Options, error) {
	opts := &server.Options{}
	if cfg.ServerConfig != "" {
		var err error
		if opts, err = server.ProcessConfigFile(cfg.ServerConfig); err != nil {
			return nil, fmt.Errorf("serve: nats config %s: %w", cfg.ServerConfig, err)
		}
	}
	if opts.ServerName == "" {
		opts.ServerName = "mmfeed"
	}
	opts.JetStream, opts.StoreDir = true, filepath.Join(cfg.DataDir, "jetstream")
	opts.NoSigs, opts.NoLog, opts.MaxPayload, opts.DontListen = true, true, cfg.MaxPayload, cfg.Listen == ""
	opts.MaxPending = max(server.MAX_PENDING_SIZE, 8*int64(cfg.MaxPayload))
	opts.Host, opts.Port = "127.0.0.1", -1
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
	if cfg.ServerTLSCert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.ServerTLSCert, KeyFile: cfg.ServerTLSKey,
			CaFile: cfg.ServerTLSCA, Verify: cfg.ServerTLSCA != ""})
		if err != nil {
			return nil, fmt.Errorf("serve: nats tls: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, cfg.ServerTLSCA != "", 5
	}
	authed := authenticates(opts)
	switch {
	case len(opts.TrustedOperators) > 0 || len(opts.TrustedKeys) > 0:
		return nil, fmt.Errorf("serve: nats config %s: operator (JWT) mode needs an external deployment (--nats URL): %w",
			cfg.ServerConfig, ErrInvalidConfig)
	case opts.Authorization != "":
		sec.token = opts.Authorization
	case opts.Username != "": // a single user: one of the users, next to the service's
		opts.Users = append(opts.Users, &server.User{Username: opts.Username, Password: opts.Password})
		opts.Username, opts.Password = "", ""
	}
	if (len(opts.Users) > 0 || len(opts.Nkeys) > 0) && sec.ServicePass != "" {
		opts.Users = append(opts.Users, &server.User{Username: internalUser, Password: sec.ServicePass, Permissions: allPermissions()})
		sec.asUser = true
	}
	if !authed && !sec.Insecure && cfg.Listen != "" && !Loopback(opts.Host) {
		return nil, fmt.Errorf("serve: nats listens on %s without authentication (--nats-config with users, or --insecure): %w", cfg.Listen, ErrInsecure)
	}
	return opts, nil
}

// authenticates reports whether the server options require clients to
// authenticate: users, nkeys, a token, trusted operators or verified client
// certificates.
func authenticates(o *server.Options) bool {
	return len(o.Users) > 0 || len(o.Nkeys) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || o.TLSVerify
}

// loopback reports whether host is a loopback name or address.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// connect opens the service's connection: in-process to the embedded server
// (with the configured token, or as internalUser: sec), or to the external URLs with the configured authentication and TLS;
// extra options come last. It reconnects forever; disconnects and
// reconnects are logged.
func Connect(cfg Config, embedded *server.Server, sec *Security, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
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
		switch {
		case sec != nil && sec.token != "":
			opts = append(opts, nats.Token(sec.token))
		case sec != nil && sec.asUser:
			opts = append(opts, nats.UserInfo(internalUser, sec.ServicePass))
		}
	} else {
		url = strings.Join(cfg.URLs, ",")
		auth, err := authOptions(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, auth...)
	}
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("serve: connect to nats %s: %w", Redact(url), err)
	}
	return nc, nil
}

// ClientOptions returns the nats.go options that authenticate to an
// external deployment as cfg says (user/password, token, NKey seed or
// credentials file; TLS CA and client certificate): what a tool like
// `mmfeed inspect` adds to its connection.
func ClientOptions(cfg Config) ([]nats.Option, error) { return authOptions(cfg) }

func authOptions(cfg Config) ([]nats.Option, error) {
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
func Redact(urls string) string {
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
