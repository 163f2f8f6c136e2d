package main

import (
	"os"
	"strings"
	"testing"
)

const configurationDoc = "../../docs/configuration.md"

// The flag block of docs/configuration.md is `adaptive-lb run`'s own flag usage, so the page and
// the binary cannot drift. ADAPTIVELB_UPDATE_DOCS=1 rewrites the block from the binary.
func TestDocs_ConfigurationListsEveryRunFlagAsTheBinaryDoes(t *testing.T) {
	data, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	const head = "## Operator flags\n\n```\nFlags:\n"
	i := strings.Index(doc, head)
	if i < 0 {
		t.Fatalf("%s has no %q block", configurationDoc, head)
	}
	start := i + len(head)
	end := strings.Index(doc[start:], "```")
	if end < 0 {
		t.Fatalf("%s: the flag block is not closed", configurationDoc)
	}
	want := newRunCmd().Flags().FlagUsages()
	if got := doc[start : start+end]; got != want {
		if os.Getenv("ADAPTIVELB_UPDATE_DOCS") != "" {
			if err := os.WriteFile(configurationDoc, []byte(doc[:start]+want+doc[start+end:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("the flag block of %s differs from `adaptive-lb run --help`; rerun with ADAPTIVELB_UPDATE_DOCS=1 to rewrite it.\ngot:\n%s\nwant:\n%s", configurationDoc, got, want)
	}
}
