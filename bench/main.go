// Command bench measures mmfeed side by side with its peers on this machine, in one run,
// and writes the ratios to bench/results.json (one flat object with stable keys). Absolute
// times on a shared 2-core machine are noise; ratios measured in the same run are not.
//
//	go run ./bench [-sections tokenize,imgproc,...] [-out bench/results.json] [-cpuprofile file]
//
// `make bench` runs it with the project's virtualenv as MMFEED_PYTHON. Every section pins
// itself to one core (GOMAXPROCS=1, taskset for the Python peer) unless it says otherwise.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"

	"github.com/mmfeed/mmfeed/imgproc"
)

// section measures one thing and returns its results (ratios and the raw numbers behind them).
type section struct {
	name string
	run  func(env *benchEnv) (map[string]float64, error)
}

var sections = []section{
	{"tokenize", benchTokenize},
	{"imgproc", benchImgproc},
	{"transport", benchTransport},
	{"transport_py", benchTransportPy},
	{"serve", benchServe},
	{"workers", benchWorkers},
	{"partition", benchPartition},
	{"plan", benchPlanQuality},
	{"plan_scale", benchPlanScale},
	{"plan_memory", benchPlanMemory},
	{"report1m", benchReport1M},
	{"e2e", benchE2E},
	{"shard", benchShard},
	{"quality", benchQuality},
	{"jpegwire", benchJPEGWire},
}

type benchEnv struct {
	python string // the virtualenv interpreter (MMFEED_PYTHON)
	corpus string // MMFEED_CORPUS: the shared real corpus, "" when absent
	tmp    string
}

func main() {
	only := flag.String("sections", "", "comma-separated sections to run (default all)")
	out := flag.String("out", "bench/results.json", "results file (merged with what is there)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the sections run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	runtime.GOMAXPROCS(1)
	tmp, err := os.MkdirTemp("", "mmfeed-bench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	env := &benchEnv{python: os.Getenv("MMFEED_PYTHON"), corpus: os.Getenv("MMFEED_CORPUS"), tmp: tmp}
	if env.python == "" {
		env.python = ".venv/bin/python"
	}
	results := map[string]float64{}
	if b, err := os.ReadFile(*out); err == nil {
		_ = json.Unmarshal(b, &results)
	}
	results["jpeg_libjpeg_turbo_version"] = jpegLibraryVersion(imgproc.JPEGLibrary()) // 0: Go's image/jpeg
	fmt.Printf("JPEG library: %s\n", imgproc.JPEGLibrary())
	failed := false
	for _, s := range sections {
		if *only != "" && !slices.Contains(strings.Split(*only, ","), s.name) {
			continue
		}
		fmt.Printf("== %s\n", s.name)
		r, err := s.run(env)
		if err != nil {
			fmt.Printf("   FAILED: %v\n", err)
			failed = true
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(r)) {
			fmt.Printf("   %-44s %12.4g\n", k, r[k])
			results[k] = r[k]
		}
	}
	b, _ := json.MarshalIndent(results, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s\n", *out)
	if failed {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
