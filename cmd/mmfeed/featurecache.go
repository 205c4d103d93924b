package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mmfeed/mmfeed/pipeline"
)

// bindFeatureCache binds --feature-cache: the folder where report and shard
// keep features by dataset fingerprint (pipeline.DirFeatureCache).
func bindFeatureCache(fs *flag.FlagSet) *string {
	return fs.String("feature-cache", defaultFeatureCache(),
		"folder of features cached by dataset fingerprint (tokenizer, image config, index, input files' size and mtime), so a second run on the same data does not compute them again; off: no cache")
}

// defaultFeatureCache is $MMFEED_FEATURE_CACHE, else features/ in the input
// cache folder (~/.cache/mmfeed/features).
func defaultFeatureCache() string {
	if d := os.Getenv("MMFEED_FEATURE_CACHE"); d != "" {
		return d
	}
	return filepath.Join(defaultInputCache(), "features")
}

// featureCache is the cache in dir, nil for "" or "off".
func featureCache(dir string) pipeline.FeatureCache {
	if dir == "" || dir == "off" {
		return nil
	}
	return pipeline.DirFeatureCache(dir)
}

// logFeatureCache says where the features came from.
func logFeatureCache(stderr io.Writer, prep *pipeline.Prepared) {
	switch {
	case prep.FeaturesCached:
		fmt.Fprintf(stderr, "features from the cache (fingerprint %s)\n", prep.Fingerprint)
	case prep.FeatureCacheErr != nil:
		fmt.Fprintf(stderr, "feature cache skipped: %v\n", prep.FeatureCacheErr)
	}
}
