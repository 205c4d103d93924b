package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve"
)

func init() {
	commands["creds"] = command{"write per-rank NATS credentials (and optionally a TLS CA) for a job", runCreds}
}

// authConfFile is the NATS server configuration `mmfeed creds` writes (what
// `serve --nats-config` and `nats-server -c` load).
const authConfFile = "auth.conf"

func runCreds(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("creds", flag.ContinueOnError)
	job := fs.String("job", "", "job name (required): the subjects the credentials are scoped to")
	dp := fs.Int("dp", 0, "data-parallel ranks (required)")
	mp := fs.Int("mp", 1, "model-parallel ranks per dp rank")
	out := fs.String("out", "", "directory to write auth.conf and one <user>.pass per identity (required)")
	force := fs.Bool("force", false, "overwrite existing credentials (every running client must get the new ones)")
	tlsHosts := fs.String("tls-hosts", "", "also write a private CA and a server certificate for these comma-separated hosts (plus localhost)")
	tlsValid := fs.Duration("tls-valid", 90*24*time.Hour, "validity of the TLS certificates")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *job == "" || *dp < 1 || *out == "" {
		fmt.Fprintln(stderr, "creds: --job, --dp and --out are required")
		return errUsage
	}
	conf := filepath.Join(*out, authConfFile)
	if _, err := os.Stat(conf); err == nil && !*force {
		return fmt.Errorf("%s exists (--force replaces every credential)", conf)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w", err)
	}
	ids, err := serve.JobIdentities(*job, *dp, *mp)
	if err != nil {
		return err
	}
	text, err := serve.AuthConfig(ids)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return fmt.Errorf("%w", err)
	}
	for _, id := range ids {
		if err := os.WriteFile(filepath.Join(*out, id.User+".pass"), []byte(id.Password+"\n"), 0o600); err != nil {
			return fmt.Errorf("%w", err)
		}
	}
	if err := os.WriteFile(conf, text, 0o600); err != nil {
		return fmt.Errorf("%w", err)
	}
	fmt.Fprintf(stdout, "wrote %s (users %s, %s, %s (read only) and %d trainer ranks) and one <user>.pass each in %s\n",
		authConfFile, serve.ServiceUser, serve.WorkerUser, serve.ViewerUser, *dp**mp, *out)
	if *tlsHosts != "" {
		if err := serve.WriteTLS(*out, strings.Split(*tlsHosts, ","), *tlsValid); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s, %s, %s, %s, %s\n", serve.TLSCAFile, serve.TLSServerCertFile, serve.TLSServerKeyFile,
			serve.TLSClientCertFile, serve.TLSClientKeyFile)
	}
	return nil
}
