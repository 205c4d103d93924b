package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve"
	"github.com/mmfeed/mmfeed/pipeline/serve/work"
)

// shardNATSFlags are the flags of `shard --nats`: the preprocessing goes to
// `serve --role worker` processes of that deployment.
type shardNATSFlags struct {
	urls string
	c    work.ShardWorkConfig
}

func bindShardNATSFlags(fs *flag.FlagSet) *shardNATSFlags {
	f := &shardNATSFlags{}
	n := &f.c.NATS
	fs.StringVar(&f.urls, "nats", "", "hand the preprocessing to mmfeed serve --role worker processes of this NATS deployment (comma-separated URLs); the files are identical to a local run's")
	fs.StringVar(&n.User, "nats-user", "", "with --nats: user (with --nats-password)")
	fs.StringVar(&n.Password, "nats-password", "", "with --nats: password (default $MMFEED_NATS_PASSWORD)")
	fs.StringVar(&n.Token, "nats-token", "", "with --nats: token (default $MMFEED_NATS_TOKEN)")
	fs.StringVar(&n.NKeySeedFile, "nats-nkey", "", "with --nats: NKey seed file")
	fs.StringVar(&n.CredsFile, "nats-creds", "", "with --nats: credentials (JWT) file")
	fs.StringVar(&n.TLSCA, "nats-tls-ca", "", "with --nats: CA certificate to verify the servers")
	fs.StringVar(&n.TLSCert, "nats-tls-cert", "", "with --nats: client certificate")
	fs.StringVar(&n.TLSKey, "nats-tls-key", "", "with --nats: client key")
	fs.DurationVar(&f.c.AckWait, "work-ack-wait", serve.DefaultConfig().WorkAckWait, "with --nats: a dead worker's item goes to another worker after about this long")
	fs.IntVar(&f.c.Ahead, "work-ahead", serve.DefaultConfig().WorkAhead, "with --nats: steps issued to the workers ahead of the one being written")
	return f
}

// checkInput makes the input path absolute, which the workers open as the
// planner names it; an input URL is refused with --nats.
func (f *shardNATSFlags) checkInput(cfg *pipeline.Config) error {
	if f.urls == "" || cfg.Mixture != nil { // a mixture's paths are absolute already
		return nil
	}
	if pipeline.IsURL(cfg.Input) {
		return fmt.Errorf("shard --nats: --input %s: the workers read the input from a path they share with this process; URL inputs are not supported with --nats yet (stage the data on a shared file system)", cfg.Input)
	}
	abs, err := filepath.Abs(cfg.Input)
	if err != nil {
		return err
	}
	cfg.Input = abs
	return nil
}

// source returns the step source of the run: nil (a local Preprocessor)
// without --nats, the workers' with it.
func (f *shardNATSFlags) source(ctx context.Context, prep *pipeline.Prepared, stderr io.Writer) (pipeline.StepSource, func(), error) {
	if f.urls == "" {
		return nil, func() {}, nil
	}
	setNATSURLs(&f.c.NATS, f.urls)
	log, err := newLogger(stderr, "text", false)
	if err != nil {
		return nil, nil, err
	}
	f.c.Logger = log
	sw, err := work.NewShardWorkers(ctx, f.c, prep)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stderr, "shard: preprocessing on the workers of %s (job %s)\n", f.urls, sw.Job())
	return sw.Run, func() {
		if err := sw.Close(); err != nil {
			log.Warn("shard: clean up the work queue", "err", err)
		}
	}, nil
}
