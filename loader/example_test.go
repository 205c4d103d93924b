package loader_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/loader/synth"
)

// Stream samples with their image bytes, writing bad ones to a quarantine.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "mmfeed-example")
	defer os.RemoveAll(dir)
	sum, err := synth.Generate(context.Background(), synth.Config{Out: dir, Samples: 20, Seed: 1, Format: synth.FormatWDS, MaxSide: 64})
	if err != nil {
		log.Fatal(err)
	}
	var qbuf bytes.Buffer // a real caller opens quarantine.jsonl
	q := loader.NewQuarantineWriter(&qbuf)
	src, err := loader.Open(sum.Path, loader.Options{OnReject: q.Func()})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	for {
		s, err := src.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		_ = s.Image // hand s to the preprocessing stage
	}
	st := src.Stats()
	fmt.Println(st.Seen == st.Emitted+st.Quarantined, st.Seen)
	// Output: true 20
}

// Plan on an index (captions, sizes, locations: no image bytes), then read
// images in epoch order.
func ExampleScan() {
	dir, _ := os.MkdirTemp("", "mmfeed-example")
	defer os.RemoveAll(dir)
	sum, err := synth.Generate(context.Background(), synth.Config{Out: dir, Samples: 10, Seed: 1, MaxSide: 64})
	if err != nil {
		log.Fatal(err)
	}
	ix, err := loader.BuildIndex(context.Background(), sum.Path, loader.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer ix.Close()
	for _, e := range ix.Order(42, 0)[:3] {
		hdr, err := ix.ReadHeader(e, 64<<10) // enough for dimensions
		if err != nil {
			log.Fatal(err) // the caller would quarantine e instead
		}
		_ = hdr
	}
	fmt.Println(ix.Len(), ix.Stats.Quarantined)
	// Output: 10 0
}
