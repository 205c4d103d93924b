package pipeline

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestReasonCodesDefinedOnce fails when two quarantine reason codes of the
// loader and the pipeline name the same thing twice: the same string, or the
// same words in another order ("empty_image" and "image_empty").
func TestReasonCodesDefinedOnce(t *testing.T) {
	seen := map[string]string{} // sorted words -> "file: Name = code"
	for _, file := range []string{"../loader/quarantine.go", "reasons.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		ast.Inspect(f, func(node ast.Node) bool {
			spec, ok := node.(*ast.ValueSpec)
			if !ok || len(spec.Names) != 1 || !strings.HasPrefix(spec.Names[0].Name, "Reason") || len(spec.Values) != 1 {
				return true
			}
			lit, ok := spec.Values[0].(*ast.BasicLit)
			if !ok {
				return true // defined by reference to the one definition
			}
			code, _ := strconv.Unquote(lit.Value)
			words := strings.Split(code, "_")
			slices.Sort(words)
			key := strings.Join(words, "_")
			where := file + ": " + spec.Names[0].Name + " = " + code
			if prev, dup := seen[key]; dup {
				t.Errorf("%s names the same as %s: use one code", where, prev)
			}
			seen[key] = where
			n++
			return true
		})
		if n == 0 {
			t.Errorf("%s: no Reason constants found", file)
		}
	}
}
