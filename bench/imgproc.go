package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/mmfeed/mmfeed/imgproc"
)

// benchImgproc: images per CPU-second for decode + shorter-crop 224 + normalize to float16,
// one core, imgproc against Pillow + numpy (scripts/pillow_peer.py) on the same files:
// 32 generated 1440×720 JPEG photos, and 300 real corpus images when MMFEED_CORPUS is set.
// CPU time rather than wall time: on a shared machine it moves far less with the load.
// Draft (DCT-domain) decoding is off on both sides, so both do the full decode.
func benchImgproc(env *benchEnv) (map[string]float64, error) {
	photos := filepath.Join(env.tmp, "photos")
	if out, err := exec.Command(env.python, "scripts/pillow_peer.py", "gen-bench", photos).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("gen-bench: %v\n%s", err, out)
	}
	sets := map[string]string{"photos": photos}
	if env.corpus != "" {
		dir, err := corpusSample(env, 300)
		if err != nil {
			return nil, err
		}
		sets["corpus"] = dir
	}
	out := map[string]float64{}
	for name, dir := range sets {
		goRate, err := imgprocRate(dir)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command("taskset", "-c", "0", env.python, "scripts/pillow_peer.py", "bench", "--dir", dir, "--repeat", "3")
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1")
		b, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("pillow bench: %w", err)
		}
		var py struct {
			Rate float64 `json:"images_per_cpu_sec"`
		}
		if err := json.Unmarshal(b, &py); err != nil {
			return nil, fmt.Errorf("pillow bench output %q: %w", b, err)
		}
		suffix := ""
		if name == "corpus" {
			suffix = "_corpus"
		}
		out["imgproc_images_per_cpu_s"+suffix] = goRate
		out["imgproc_pillow_images_per_cpu_s"+suffix] = py.Rate
		out["imgproc_vs_pillow"+suffix] = goRate / py.Rate
	}
	return out, nil
}

func imgprocRate(dir string) (float64, error) {
	var blobs [][]byte
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && !e.IsDir() {
			blobs = append(blobs, b)
		}
	}
	c := imgproc.DefaultConfig()
	c.JPEGDraftGap = 0
	p, err := imgproc.NewProcessor(c)
	if err != nil {
		return 0, err
	}
	for _, b := range blobs { // warm-up
		p.Process(b)
	}
	best := 0.0
	for range 3 {
		cpu0 := cpuTime()
		for _, b := range blobs {
			p.Process(b) // undecodable files count, as in the peer
		}
		best = max(best, float64(len(blobs))/(cpuTime()-cpu0).Seconds())
	}
	return best, nil
}

// corpusSample links n evenly spaced images of the real corpus into one folder.
func corpusSample(env *benchEnv, n int) (string, error) {
	var all []string
	root := filepath.Join(env.corpus, "dev", "images")
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			all = append(all, p)
		}
		return nil
	})
	if len(all) == 0 {
		return "", fmt.Errorf("no images under %s", root)
	}
	slices.Sort(all)
	dir := filepath.Join(env.tmp, "corpus-sample")
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
