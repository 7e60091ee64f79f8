package nccl_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryExportedIdentifierIsDocumented: the packages of the public surface
// (docs/extending.md) are what a vendor reads with go doc, so each has a
// package comment and every exported constant, variable, function, type and
// method has a doc comment (constants may share their group's).
func TestEveryExportedIdentifierIsDocumented(t *testing.T) {
	for _, dir := range []string{".", "nccltest", "../forkguard"} {
		fset := token.NewFileSet()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var files []*ast.File
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		if len(files) == 0 {
			t.Fatalf("%s: no Go files", dir)
		}
		d, err := doc.NewFromFiles(fset, files, dir)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(d.Doc) == "" {
			t.Errorf("%s: package %s has no package comment", dir, d.Name)
		}
		values := func(vs []*doc.Value) {
			for _, v := range vs {
				for _, s := range v.Decl.Specs {
					spec := s.(*ast.ValueSpec)
					for _, n := range spec.Names {
						if n.IsExported() && v.Doc == "" && spec.Doc == nil && spec.Comment == nil {
							t.Errorf("%s: %s %s has no doc comment", fset.Position(n.Pos()), v.Decl.Tok, n.Name)
						}
					}
				}
			}
		}
		funcs := func(fs []*doc.Func, recv string) {
			for _, f := range fs {
				if f.Doc == "" {
					t.Errorf("%s: func %s%s has no doc comment", fset.Position(f.Decl.Pos()), recv, f.Name)
				}
			}
		}
		values(d.Consts)
		values(d.Vars)
		funcs(d.Funcs, "")
		for _, ty := range d.Types {
			if ty.Doc == "" {
				t.Errorf("%s: type %s has no doc comment", fset.Position(ty.Decl.Pos()), ty.Name)
			}
			values(ty.Consts)
			values(ty.Vars)
			funcs(ty.Funcs, "")
			funcs(ty.Methods, "("+ty.Name+") ")
		}
	}
}
