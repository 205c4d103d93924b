package pipeline

import (
	"fmt"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
)

// KeepColumns returns the kept columns of batches built from ix (Config.Loader.Keep,
// typed over the whole index: loader.Index.KeepTypes); nil when the job keeps nothing.
// Every BatchMeta of a job carries them, so every record of a stream or a shard file has
// one schema.
func KeepColumns(ix *loader.Index) []proto.KeepColumn {
	fields, types := ix.Keep(), ix.KeepTypes()
	if len(fields) == 0 {
		return nil
	}
	out := make([]proto.KeepColumn, len(fields))
	for i, f := range fields {
		t := proto.KeepUTF8
		switch types[i] {
		case loader.KeepInt:
			t = proto.KeepInt64
		case loader.KeepFloat:
			t = proto.KeepFloat64
		}
		out[i] = proto.KeepColumn{Name: f.Name, Type: t}
	}
	return out
}

// keepValues returns entry ent's kept values as rows carry them (nil without --keep).
func keepValues(ix *loader.Index, ent loader.Entry) []proto.KeepValue {
	vals := ix.Kept(ent)
	if vals == nil {
		return nil
	}
	out := make([]proto.KeepValue, len(vals))
	for i, v := range vals {
		out[i] = proto.KeepValue(v)
	}
	return out
}

// KeptReport describes the kept columns of ix for a report: name, type and how many of
// the index's entries lack the field (null in the batches).
func KeptReport(ix *loader.Index) []balancer.KeptColumn {
	cols, missing := KeepColumns(ix), ix.KeepMissing()
	if cols == nil {
		return nil
	}
	out := make([]balancer.KeptColumn, len(cols))
	for i, c := range cols {
		out[i] = balancer.KeptColumn{Name: c.Name, Type: c.Type, Missing: missing[i]}
	}
	return out
}

// KeptLine is one line naming the kept columns and their missing counts, "" without.
func KeptLine(kept []balancer.KeptColumn) string {
	if len(kept) == 0 {
		return ""
	}
	parts := make([]string, len(kept))
	for i, k := range kept {
		parts[i] = fmt.Sprintf("%s (%s, %d missing)", k.Name, k.Type, k.Missing)
	}
	return "kept columns: " + strings.Join(parts, ", ")
}
