package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mmfeed/mmfeed/pipeline/serve"
	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

func init() {
	commands["serve"] = command{"stream balanced batches to trainer ranks over NATS, with a live balance report", runServe}
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f := bindServeFlags(fs)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if f.c.Role == serve.RoleWorker {
		return runWorker(ctx, f.c, *f.urls, *f.slots, *f.logFormat, *f.verbose, stderr)
	}
	if f.c.Job == "" {
		fmt.Fprintln(stderr, "serve: --job is required")
		return errUsage
	}
	c, err := f.config(stderr)
	if err != nil {
		return err
	}
	s, err := serve.New(c)
	if err != nil {
		return err
	}
	if err := s.Run(ctx); err != nil {
		return err
	}
	st := s.Stats()
	fmt.Fprintf(stdout, "published %d samples in %d batches (%.1f MB) in %.1fs (%.0f samples/s)\n",
		st.Samples, st.Batches, float64(st.Bytes)/1e6, st.ElapsedSeconds, float64(st.Samples)/max(st.ElapsedSeconds, 1e-9))
	return nil
}

// serveFlags are serve's flags, bound into c and the values below.
type serveFlags struct {
	c                          serve.Config
	jf                         *jobFlags
	maxPayload, slots          *int
	urls, logFormat            *string
	baselines, noWait, verbose *bool
}

func bindServeFlags(fs *flag.FlagSet) *serveFlags {
	f := &serveFlags{c: serve.DefaultConfig()}
	f.jf = bindJobFlags(fs)
	fs.StringVar(&f.c.Job, "job", "", "job name, [A-Za-z0-9_-]{1,64}: subjects, stream, consumers and KV bucket (required)")
	fs.IntVar(&f.c.MP, "mp", f.c.MP, "model-parallel ranks per dp rank (placement modality: 2)")
	fs.IntVar(&f.c.Epochs, "epochs", f.c.Epochs, "epochs to serve, from --epoch")
	f.bindNATS(fs)
	f.bindRoles(fs)
	f.bindStream(fs)
	f.bindReport(fs)
	f.verbose = fs.Bool("v", false, "debug logging")
	f.logFormat = fs.String("log-format", "text", "log lines as text or json (log/slog)")
	return f
}

// bindNATS binds the NATS deployment's flags: the embedded server's, or an
// external one's with its authentication and TLS.
func (f *serveFlags) bindNATS(fs *flag.FlagSet) {
	f.c.NATS.Listen = "127.0.0.1:4222"
	fs.StringVar(&f.c.NATS.Listen, "nats-listen", f.c.NATS.Listen, "embedded server client address (\"\": in-process only)")
	fs.StringVar(&f.c.NATS.DataDir, "data-dir", f.c.NATS.DataDir, "embedded server JetStream store and quarantine files")
	f.maxPayload = fs.Int("nats-max-payload", int(f.c.NATS.MaxPayload), "embedded server max_payload, bytes")
	f.urls = fs.String("nats", "", "existing NATS deployment, comma-separated URLs (instead of the embedded server)")
	fs.StringVar(&f.c.NATS.User, "nats-user", "", "external NATS user (with --nats-password)")
	fs.StringVar(&f.c.NATS.Password, "nats-password", "", "external NATS password (default $MMFEED_NATS_PASSWORD with --nats)")
	fs.StringVar(&f.c.NATS.Token, "nats-token", "", "external NATS token (default $MMFEED_NATS_TOKEN with --nats)")
	fs.StringVar(&f.c.NATS.NKeySeedFile, "nats-nkey", "", "external NATS NKey seed file")
	fs.StringVar(&f.c.NATS.CredsFile, "nats-creds", "", "external NATS credentials (JWT) file")
	fs.StringVar(&f.c.NATS.TLSCA, "nats-tls-ca", "", "CA certificate to verify the external NATS servers")
	fs.StringVar(&f.c.NATS.TLSCert, "nats-tls-cert", "", "client certificate for the external NATS servers")
	fs.StringVar(&f.c.NATS.TLSKey, "nats-tls-key", "", "client key for the external NATS servers")
	fs.StringVar(&f.c.NATS.ServerConfig, "nats-config", "", "NATS server configuration file for the embedded server: users and permissions (mmfeed creds writes one), accounts, TLS")
	fs.StringVar(&f.c.NATS.ServerTLSCert, "nats-listen-tls-cert", "", "embedded server: TLS certificate (clients must use TLS)")
	fs.StringVar(&f.c.NATS.ServerTLSKey, "nats-listen-tls-key", "", "embedded server: TLS key")
	fs.StringVar(&f.c.NATS.ServerTLSCA, "nats-listen-tls-ca", "", "embedded server: require client certificates signed by this CA")
	fs.BoolVar(&f.c.Insecure, "insecure", false, "allow NATS or HTTP on a non-loopback address without authentication")
}

// bindRoles binds the role, the workers' and the lease's flags.
func (f *serveFlags) bindRoles(fs *flag.FlagSet) {
	fs.StringVar(&f.c.Role, "role", f.c.Role, "all (plan and preprocess here), planner (plan here, preprocess on --role worker processes) or worker (preprocess any job's items; needs only --nats and its credentials)")
	fs.IntVar(&f.c.LocalWorkers, "local-workers", 0, "with --role planner: also preprocess items here, this many at once (0: workers only)")
	fs.DurationVar(&f.c.WorkAckWait, "work-ack-wait", f.c.WorkAckWait, "with --role planner: a dead worker's item goes to another worker after about this long")
	f.slots = fs.Int("slots", 0, "with --role worker: items preprocessed at once, one core each (0: all cores)")
	fs.DurationVar(&f.c.LeaseTTL, "lease-ttl", f.c.LeaseTTL, "job leadership lease: a second service for the same job stands by and takes over within about this long of the leader's death")
}

// bindStream binds the data plane's, the assets' and the end's flags.
func (f *serveFlags) bindStream(fs *flag.FlagSet) {
	fs.StringVar(&f.c.DataPlane, "data-plane", f.c.DataPlane, "how payloads travel: core (NATS, in memory, each rank asks for its batches) or jetstream (a stream, one durable consumer per rank)")
	fs.Int64Var(&f.c.StreamMaxBytes, "stream-max-bytes", f.c.StreamMaxBytes, "bound on the batches held for the trainers (the outbox, or the stream with --data-plane jetstream): backpressure, bytes")
	fs.BoolVar(&f.c.StreamMemory, "stream-memory", false, "keep the stream in memory instead of files")
	fs.IntVar(&f.c.Replicas, "replicas", f.c.Replicas, "stream and KV replicas in a NATS cluster")
	fs.IntVar(&f.c.MaxAckPending, "max-ack-pending", f.c.MaxAckPending, "per-rank prefetch bound, chunks")
	fs.DurationVar(&f.c.AckWait, "ack-wait", f.c.AckWait, "redelivery timeout of unacknowledged chunks")
	fs.DurationVar(&f.c.AssetCheck, "asset-check", f.c.AssetCheck, "check the job's JetStream assets this often and recreate lost ones (0: never)")
	fs.DurationVar(&f.c.StuckAfter, "stuck-after", f.c.StuckAfter, "unreachable assets or a publish stuck this long: errors in the log, 503 on /healthz")
	fs.DurationVar(&f.c.GiveUpAfter, "give-up-after", f.c.GiveUpAfter, "stop with an error when the assets stay unreachable or a publish keeps failing this long (0: never)")
	f.noWait = fs.Bool("no-wait", false, "exit once everything is published instead of when every rank completed")
}

// bindReport binds the cost model's, the report's and the HTTP flags.
func (f *serveFlags) bindReport(fs *flag.FlagSet) {
	fs.StringVar(&f.c.CostModelOut, "cost-model-out", "", "rewrite this file with the cost model after every refit (what --cost-model reads)")
	fs.StringVar(&f.c.ReportOut, "report-out", "", "write the run report (JSON + HTML: the balance report, the live section and the measured per-rank step times, imbalance measured vs predicted, quarantine) to this directory at every epoch's end and on exit")
	fs.IntVar(&f.c.Recalibrate, "recalibrate", f.c.Recalibrate, "refit the cost model from trainer feedback: 0 at epoch boundaries, K every K steps, -1 never")
	fs.StringVar(&f.c.HTTP, "http", "127.0.0.1:8080", "live report address (\"\": none)")
	fs.StringVar(&f.c.HTTPToken, "http-token", os.Getenv("MMFEED_HTTP_TOKEN"), "bearer token for the HTTP endpoints (default $MMFEED_HTTP_TOKEN)")
	fs.StringVar(&f.c.HTTPTLSCert, "http-tls-cert", "", "serve HTTPS with this certificate (PEM; with --http-tls-key; mmfeed creds --tls-hosts writes one)")
	fs.StringVar(&f.c.HTTPTLSKey, "http-tls-key", "", "key of --http-tls-cert (PEM)")
	fs.BoolVar(&f.c.AllowResize, "allow-resize", false, "take over a job recorded at another --dp: the rest of the epoch, from the resuming trainers' position, is replanned for this dp (core data plane)")
	f.baselines = fs.Bool("report-baselines", true, "plan every epoch with the other strategies too, for the live report's comparison (false: only the job's strategy; the mmfeed baseline is costly at a few hundred dp ranks)")
	fs.DurationVar(&f.c.ProgressEvery, "progress-every", f.c.ProgressEvery, "log the trainers' progress through the epoch, with rate and ETA, this often (0: never)")
}

// config completes the service's Config from the parsed flags.
func (f *serveFlags) config(stderr io.Writer) (serve.Config, error) {
	c := f.c
	var err error
	if c.Pipeline, err = f.jf.config(); err != nil {
		return c, err
	}
	if *f.urls != "" {
		setNATSURLs(&c.NATS, *f.urls)
	}
	c.NATS.MaxPayload = int32(min(*f.maxPayload, 1<<30))
	c.QuarantineDir = c.NATS.DataDir
	c.WaitForTrainers = !*f.noWait
	c.NoBaselines = !*f.baselines
	c.Logger, err = newLogger(stderr, *f.logFormat, *f.verbose)
	return c, err
}

// setNATSURLs selects an external deployment, with the password or token
// from the environment when no flag gave one.
func setNATSURLs(n *natsenv.Config, urls string) {
	n.URLs = strings.Split(urls, ",")
	n.Listen = ""
	if n.User != "" && n.Password == "" {
		n.Password = os.Getenv("MMFEED_NATS_PASSWORD")
	}
	if n.Token == "" && n.User == "" && n.NKeySeedFile == "" && n.CredsFile == "" {
		n.Token = os.Getenv("MMFEED_NATS_TOKEN")
	}
}

// runWorker is `serve --role worker`: only the NATS flags apply.
func runWorker(ctx context.Context, c serve.Config, urls string, slots int, logFormat string, verbose bool, stderr io.Writer) error {
	if urls == "" {
		fmt.Fprintln(stderr, "serve: --role worker needs --nats URL (the planner's NATS deployment)")
		return errUsage
	}
	setNATSURLs(&c.NATS, urls)
	log, err := newLogger(stderr, logFormat, verbose)
	if err != nil {
		return err
	}
	return work.RunWorker(ctx, work.WorkerConfig{NATS: c.NATS, Slots: slots, Logger: log.With("role", "worker")})
}
