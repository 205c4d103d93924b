package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// benchTransportPy: the Python receive path (the trainer's wire.Reassembler and a zero-copy
// Arrow decode) against raw nats-py receiving the same bytes in the same chunk sizes, both
// through a NATS server with the service's max_payload (8 MiB) started here
// (scripts/bench_transport_py.py says how).
func benchTransportPy(env *benchEnv) (map[string]float64, error) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, MaxPayload: 8 << 20, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		return nil, fmt.Errorf("nats server not ready")
	}
	cmd := exec.Command(env.python, "scripts/bench_transport_py.py", s.ClientURL())
	cmd.Env = append(os.Environ(), "PYTHONPATH=trainer:"+os.Getenv("PYTHONPATH")) // the trainer from the checkout
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("python transport peer: %w\n%s", err, exitStderr(err))
	}
	var r struct {
		Raw    float64 `json:"raw_mb_per_s"`
		MMFeed float64 `json:"mmfeed_mb_per_s"`
		Ratio  float64 `json:"ratio"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Raw == 0 {
		return nil, fmt.Errorf("python transport peer output %q: %v", out, err)
	}
	fmt.Printf("   %s", out)
	return map[string]float64{
		"transport_py_mb_per_s":          r.MMFeed,
		"transport_raw_nats_py_mb_per_s": r.Raw,
		"transport_py_vs_raw_nats_py":    r.Ratio,
	}, nil
}

func exitStderr(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}
