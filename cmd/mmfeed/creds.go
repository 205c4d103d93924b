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
	"syscall"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
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
	if _, err := os.Lstat(conf); err == nil && !*force {
		return fmt.Errorf("%s exists (--force replaces every credential)", conf)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w", err)
	}
	ids, err := natsenv.JobIdentities(*job, *dp, *mp)
	if err != nil {
		return err
	}
	text, err := natsenv.AuthConfig(ids)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return fmt.Errorf("%w", err)
	}
	for _, id := range ids {
		if err := writeNew(filepath.Join(*out, id.User+".pass"), []byte(id.Password+"\n"), 0o600, *force); err != nil {
			return err
		}
	}
	if err := writeNew(conf, text, 0o600, *force); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (users %s, %s, %s (read only) and %d trainer ranks) and one <user>.pass each in %s\n",
		authConfFile, natsenv.ServiceUser, natsenv.WorkerUser, natsenv.ViewerUser, *dp**mp, *out)
	if *tlsHosts != "" {
		if err := writeTLS(*out, strings.Split(*tlsHosts, ","), *tlsValid, *force); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s, %s, %s, %s, %s\n", natsenv.TLSCAFile, natsenv.TLSServerCertFile, natsenv.TLSServerKeyFile,
			natsenv.TLSClientCertFile, natsenv.TLSClientKeyFile)
	}
	return nil
}

// writeNew creates path holding data with mode, as a new file: O_CREAT|O_EXCL
// (an existing file or link, dangling or not, fails) and O_NOFOLLOW, so a
// link planted in --out is never written through and a planted file never
// keeps its own mode. With replace, whatever is at path is removed first
// (a link itself, never its target) and the file is then created the same
// way.
func writeNew(path string, data []byte, mode os.FileMode, replace bool) error {
	if replace {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("creds: replace %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creds: %s exists (--force replaces every credential)", path)
	}
	if err != nil {
		return fmt.Errorf("creds: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("creds: write %s: %w", path, err)
	}
	return nil
}

// tlsFiles are the files natsenv.WriteTLS writes.
var tlsFiles = []string{natsenv.TLSCAFile, natsenv.TLSServerCertFile, natsenv.TLSServerKeyFile, natsenv.TLSClientCertFile, natsenv.TLSClientKeyFile}

// writeTLS has natsenv.WriteTLS write the CA and certificates into a fresh
// private folder (0700, a name nobody can plant in beforehand) inside out,
// then moves each file into out with writeNew, keeping its mode (0644 for
// certificates, 0600 for keys), and removes the folder.
func writeTLS(out string, hosts []string, valid time.Duration, replace bool) error {
	stage, err := os.MkdirTemp(out, ".tls-")
	if err != nil {
		return fmt.Errorf("creds: %w", err)
	}
	defer os.RemoveAll(stage)
	if err := natsenv.WriteTLS(stage, hosts, valid); err != nil {
		return err
	}
	for _, name := range tlsFiles {
		p := filepath.Join(stage, name)
		data, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("creds: %w", err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("creds: %w", err)
		}
		if err := writeNew(filepath.Join(out, name), data, fi.Mode().Perm(), replace); err != nil {
			return err
		}
	}
	return nil
}
