package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Size limits of the module's non-test Go code (issue 24): files that fit one
// head, functions that fit one screen.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

// longFuncs are the functions over maxFuncLines that other work is
// shortening, as "path name". An entry that no longer needs to be here fails
// the test too, so the list only shrinks.
var longFuncs = map[string]bool{}

// sourceFile is one parsed non-test Go file of the module.
type sourceFile struct {
	rel   string // slash path from the module root
	lines int
	fset  *token.FileSet
	file  *ast.File
}

// moduleSources parses every non-test Go file under the module root
// (skipping hidden folders, testdata and the build link).
func moduleSources(t *testing.T) []sourceFile {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Skipf("module root not found: %v", err)
	}
	var out []sourceFile
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, sourceFile{rel: filepath.ToSlash(rel), lines: fset.Position(f.End()).Line, fset: fset, file: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no Go files found under the module root")
	}
	return out
}

// TestSizeLimits: no non-test Go file over maxFileLines lines, no function
// over maxFuncLines (longFuncs aside).
func TestSizeLimits(t *testing.T) {
	seen := map[string]bool{}
	for _, sf := range moduleSources(t) {
		if sf.lines > maxFileLines {
			t.Errorf("%s has %d lines, over %d: split it", sf.rel, sf.lines, maxFileLines)
		}
		for _, d := range sf.file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := sf.fset.Position(fd.End()).Line - sf.fset.Position(fd.Pos()).Line + 1
			key := sf.rel + " " + fd.Name.Name
			if n <= maxFuncLines {
				continue
			}
			seen[key] = true
			if !longFuncs[key] {
				t.Errorf("%s:%d: %s has %d lines, over %d", sf.rel, sf.fset.Position(fd.Pos()).Line, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
	for key := range longFuncs {
		if !seen[key] {
			t.Errorf("%s is no longer over %d lines (or gone): remove it from longFuncs", key, maxFuncLines)
		}
	}
}

// TestPolicyNamesOneSource: outside imgproc, code compares an image policy
// with imgproc's constants (imgproc.PolicyDynamic, ...), never with a string
// literal that could drift from them.
func TestPolicyNamesOneSource(t *testing.T) {
	for _, sf := range moduleSources(t) {
		if strings.HasPrefix(sf.rel, "imgproc/") {
			continue
		}
		ast.Inspect(sf.file, func(n ast.Node) bool {
			b, ok := n.(*ast.BinaryExpr)
			if !ok || (b.Op != token.EQL && b.Op != token.NEQ) {
				return true
			}
			for _, pair := range [][2]ast.Expr{{b.X, b.Y}, {b.Y, b.X}} {
				sel, isSel := pair[0].(*ast.SelectorExpr)
				lit, isLit := pair[1].(*ast.BasicLit)
				if isSel && isLit && sel.Sel.Name == "Policy" && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					t.Errorf("%s: compares .Policy with the literal %q: use imgproc's Policy constant", sf.fset.Position(b.Pos()), v)
				}
			}
			return true
		})
	}
}
