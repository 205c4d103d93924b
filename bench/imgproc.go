package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mmfeed/mmfeed/imgproc"
)

// benchImgproc: images per CPU-second for decode + shorter-crop 224 + normalize to float16,
// one core, imgproc against Pillow + numpy (scripts/pillow_peer.py bench-serve) on the same
// files, the two sides' passes interleaved in the same run (imgprocRounds rounds, the side
// that goes first alternating), so both see the same machine load. Sets: 32 generated
// 1440×720 JPEG photos; with MMFEED_CORPUS, 300 real corpus images (mostly PNG) and 96 of
// the corpus's JPEGs (1–14 MP). CPU time rather than wall time: on a shared machine it
// moves far less with the load.
//
// Keys, per set (suffix "", "_corpus", "_corpus_jpeg"); each ratio is the median of the
// per-round ratios:
//   - imgproc_vs_pillow: --decode exact against Pillow's full decode (what torchvision does)
//   - imgproc_fast_vs_pillow: --decode fast against Pillow's full decode
//   - imgproc_fast_vs_pillow_draft: --decode fast against Pillow with draft(), the same
//     DCT-scaling rule (both sides drafting)
func benchImgproc(env *benchEnv) (map[string]float64, error) {
	if err := requireTurbo(); err != nil {
		return nil, err
	}
	photos := filepath.Join(env.tmp, "photos")
	if out, err := exec.Command(env.python, "scripts/pillow_peer.py", "gen-bench", photos).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gen-bench: %v\n%s", err, out)
	}
	type set struct{ suffix, dir string }
	sets := []set{{"", photos}}
	if env.corpus != "" {
		dir, err := corpusSample(env, "corpus-sample", 300, nil)
		if err != nil {
			return nil, err
		}
		jpegs, err := corpusSample(env, "corpus-jpeg", 96, func(p string) bool {
			return strings.EqualFold(filepath.Ext(p), ".jpg")
		})
		if err != nil {
			return nil, err
		}
		sets = append(sets, set{"_corpus", dir}, set{"_corpus_jpeg", jpegs})
	}
	peer, err := startPillowPeer(env)
	if err != nil {
		return nil, err
	}
	defer peer.close()
	fmt.Printf("   JPEG library: %s\n", imgproc.JPEGLibrary())
	out := map[string]float64{}
	for _, s := range sets {
		r, err := imgprocSet(s.dir, peer)
		if err != nil {
			return nil, err
		}
		for k, v := range r {
			out[k+s.suffix] = v
		}
	}
	return out, nil
}

const imgprocRounds = 5

// imgprocSet runs the interleaved rounds on one folder and returns rates and ratios.
func imgprocSet(dir string, peer *pillowPeer) (map[string]float64, error) {
	blobs, err := readBlobs(dir)
	if err != nil {
		return nil, err
	}
	exact, fast := imgproc.DefaultConfig(), imgproc.DefaultConfig()
	fast.Decode = imgproc.DecodeFast
	goSide := func(c imgproc.Config) (func() (float64, error), error) {
		p, err := imgproc.NewProcessor(c)
		if err != nil {
			return nil, err
		}
		goPass(p, blobs) // warm-up
		return func() (float64, error) { return goPass(p, blobs), nil }, nil
	}
	goExact, err := goSide(exact)
	if err != nil {
		return nil, err
	}
	goFast, err := goSide(fast)
	if err != nil {
		return nil, err
	}
	rates, err := interleave([]benchSide{
		{"imgproc_images_per_cpu_s", goExact},
		{"imgproc_fast_images_per_cpu_s", goFast},
		{"imgproc_pillow_images_per_cpu_s", func() (float64, error) { return peer.pass(dir, 0) }},
		{"imgproc_pillow_draft_images_per_cpu_s", func() (float64, error) { return peer.pass(dir, fast.JPEGDraftGap) }},
	}, imgprocRounds)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   %s (%d files)\n", filepath.Base(dir), len(blobs))
	out := bestRates(rates)
	out["imgproc_vs_pillow"] = ratioOf(rates, "imgproc_vs_pillow", "imgproc_images_per_cpu_s", "imgproc_pillow_images_per_cpu_s")
	out["imgproc_fast_vs_pillow"] = ratioOf(rates, "imgproc_fast_vs_pillow", "imgproc_fast_images_per_cpu_s", "imgproc_pillow_images_per_cpu_s")
	out["imgproc_fast_vs_pillow_draft"] = ratioOf(rates, "imgproc_fast_vs_pillow_draft", "imgproc_fast_images_per_cpu_s", "imgproc_pillow_draft_images_per_cpu_s")
	return out, nil
}

// goPass processes every blob once and returns images per CPU-second.
func goPass(p *imgproc.Processor, blobs [][]byte) float64 {
	cpu0 := cpuTime()
	for _, b := range blobs {
		p.Process(b) // undecodable files count, as in the peer
	}
	return float64(len(blobs)) / (cpuTime() - cpu0).Seconds()
}

func readBlobs(dir string) ([][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var blobs [][]byte
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && !e.IsDir() {
			blobs = append(blobs, b)
		}
	}
	if len(blobs) == 0 {
		return nil, fmt.Errorf("no images in %s", dir)
	}
	return blobs, nil
}

// pillowPeer is a running `pillow_peer.py bench-serve`, pinned to one core.
type pillowPeer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPillowPeer(env *benchEnv) (*pillowPeer, error) {
	cmd := exec.Command("taskset", "-c", "0", env.python, "scripts/pillow_peer.py", "bench-serve")
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pillow peer: %w", err)
	}
	return &pillowPeer{cmd: cmd, in: in, out: bufio.NewScanner(stdout)}, nil
}

// pass asks the peer for one timed pass over dir (draft gap 0: full decode).
func (p *pillowPeer) pass(dir string, draftGap float64) (float64, error) {
	req, _ := json.Marshal(map[string]any{"dir": dir, "draft_gap": draftGap})
	if _, err := p.in.Write(append(req, '\n')); err != nil {
		return 0, fmt.Errorf("pillow peer: %w", err)
	}
	if !p.out.Scan() {
		return 0, fmt.Errorf("pillow peer exited: %v", p.out.Err())
	}
	var r struct {
		Rate float64 `json:"images_per_cpu_sec"`
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil || r.Rate <= 0 {
		return 0, fmt.Errorf("pillow peer output %q: %v", p.out.Bytes(), err)
	}
	return r.Rate, nil
}

func (p *pillowPeer) close() {
	p.in.Close()
	p.cmd.Wait()
}

// corpusSample links n evenly spaced images of the real corpus (those keep accepts, all
// when nil) into one folder under env.tmp.
func corpusSample(env *benchEnv, name string, n int, keep func(string) bool) (string, error) {
	var all []string
	root := filepath.Join(env.corpus, "dev", "images")
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (keep == nil || keep(p)) {
			all = append(all, p)
		}
		return nil
	})
	if len(all) == 0 {
		return "", fmt.Errorf("no images under %s", root)
	}
	slices.Sort(all)
	dir := filepath.Join(env.tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for i := range min(n, len(all)) {
		src := all[i*len(all)/min(n, len(all))]
		if err := os.Symlink(src, filepath.Join(dir, fmt.Sprintf("%04d%s", i, filepath.Ext(src)))); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
