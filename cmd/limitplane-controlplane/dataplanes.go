package main

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/limitplane/limitplane/controlplane"
)

// dataPlaneEntry is one entry of the -dataplanes file: a data-plane
// token, the group it opens streams for and the tags it may ask for.
// The token is given by exactly one of TokenHash, TokenEnv and TokenFile.
type dataPlaneEntry struct {
	Group string   `yaml:"group"`
	Tags  []string `yaml:"tags"`
	// TokenHash is controlplane.HashToken of the token: "sha256:" and 64
	// hex digits. The file then holds no secret.
	TokenHash string `yaml:"token_hash"`
	// TokenEnv names an environment variable holding the token.
	TokenEnv string `yaml:"token_env"`
	// TokenFile is a file holding the token (one line; a trailing
	// newline is dropped), relative to the -dataplanes file's directory.
	TokenFile string `yaml:"token_file"`
}

// loadDataPlanes reads the -dataplanes file at path: a YAML list of
// entries (see dataPlaneEntry; unknown fields are errors). Plaintext
// tokens (token_env, token_file) are hashed at once. Every error names
// the file, and the entry by its number and line: a missing group, not
// exactly one of token_hash, token_env and token_file, a hash that is not
// "sha256:" and 64 hex digits, an empty or unset variable, an unreadable
// or empty token file, an empty tag, the same token twice, or no entry.
func loadDataPlanes(path string, getenv func(string) string) ([]controlplane.DataPlaneToken, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dataplanes file: %w", err)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("dataplanes file %s: "+format, append([]any{path}, args...)...)
	}
	// The file's shape is checked on its nodes first, so that a wrong
	// field or type is said by line and field, not in the YAML library's
	// Go types; the entries' lines serve the checks below too.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fail("%v", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if errs := dataPlanesShape(&doc); len(errs) > 0 {
		return nil, fail("%s", strings.Join(errs, "; "))
	}
	var entries []dataPlaneEntry
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&entries); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, fail("%s", strings.Join(te.Errors, "; "))
		}
		return nil, fail("%v", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	line := func(i int) int {
		if len(doc.Content) == 1 && i < len(doc.Content[0].Content) {
			return doc.Content[0].Content[i].Line
		}
		return 0
	}
	if len(entries) == 0 {
		return nil, fail("no data-plane tokens (want a list of entries with group, tags and token_hash, token_env or token_file)")
	}
	var out []controlplane.DataPlaneToken
	for i, e := range entries {
		at := fmt.Sprintf("line %d: entry %d", line(i), i+1)
		if e.Group == "" {
			return nil, fail("%s: group: missing", at)
		}
		at += fmt.Sprintf(" (group %q)", e.Group)
		for j, t := range e.Tags {
			if t == "" {
				return nil, fail("%s: tags[%d]: empty", at, j)
			}
		}
		n := 0
		for _, s := range []string{e.TokenHash, e.TokenEnv, e.TokenFile} {
			if s != "" {
				n++
			}
		}
		if n != 1 {
			return nil, fail("%s: give exactly one of token_hash, token_env and token_file", at)
		}
		var hash string
		switch {
		case e.TokenHash != "":
			h, ok := strings.CutPrefix(e.TokenHash, "sha256:")
			if b, err := hex.DecodeString(h); !ok || err != nil || len(b) != 32 {
				return nil, fail("%s: token_hash: %q is not \"sha256:\" and 64 hex digits", at, e.TokenHash)
			}
			hash = "sha256:" + strings.ToLower(h)
		case e.TokenEnv != "":
			tok := getenv(e.TokenEnv)
			if tok == "" {
				return nil, fail("%s: token_env: the environment variable %s is unset or empty", at, e.TokenEnv)
			}
			hash = controlplane.HashToken(tok)
		default:
			f := e.TokenFile
			if !filepath.IsAbs(f) {
				f = filepath.Join(filepath.Dir(path), f)
			}
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fail("%s: token_file: %v", at, err)
			}
			tok := strings.TrimRight(string(b), "\r\n")
			if tok == "" {
				return nil, fail("%s: token_file: %s is empty", at, f)
			}
			hash = controlplane.HashToken(tok)
		}
		for j, o := range out {
			if o.Hash == hash {
				return nil, fail("%s: the same token as entry %d (line %d); each token has one group and scope", at, j+1, line(j))
			}
		}
		out = append(out, controlplane.DataPlaneToken{Hash: hash, Group: e.Group, Tags: e.Tags})
	}
	return out, nil
}

// dataPlanesShape returns the shape errors of a -dataplanes document, each
// "line L: entry N: field: what is wrong": the document must be a list of
// mappings whose keys are dataPlaneEntry's fields, tags a list of strings
// and the other fields strings. Aliases are followed.
func dataPlanesShape(doc *yaml.Node) []string {
	if len(doc.Content) == 0 {
		return nil // empty: "no data-plane tokens" is said after
	}
	list := deref(doc.Content[0])
	if list.Kind != yaml.SequenceNode {
		return []string{fmt.Sprintf("line %d: want a list of entries (- group: ..., token_hash: ...), not %s", list.Line, kindName(list))}
	}
	var errs []string
	for i, e := range list.Content {
		e = deref(e)
		at := fmt.Sprintf("line %d: entry %d", e.Line, i+1)
		if e.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Sprintf("%s: want a mapping (group, tags, token_hash, token_env, token_file), not %s", at, kindName(e)))
			continue
		}
		for j := 0; j+1 < len(e.Content); j += 2 {
			k, v := e.Content[j], deref(e.Content[j+1])
			at := fmt.Sprintf("line %d: entry %d: %s", k.Line, i+1, k.Value)
			switch k.Value {
			case "group", "token_hash", "token_env", "token_file":
				if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
					errs = append(errs, fmt.Sprintf("%s: want a string, not %s", at, kindName(v)))
				}
			case "tags":
				if v.Kind != yaml.SequenceNode {
					errs = append(errs, fmt.Sprintf("%s: want a list of strings (tags: [eu, prod]), not %s", at, kindName(v)))
					continue
				}
				for n, t := range v.Content {
					if t = deref(t); t.Kind != yaml.ScalarNode || t.Tag == "!!null" {
						errs = append(errs, fmt.Sprintf("%s[%d]: want a string, not %s", at, n, kindName(t)))
					}
				}
			default:
				errs = append(errs, fmt.Sprintf("%s: unknown field (known here: group, tags, token_hash, token_env, token_file)", at))
			}
		}
	}
	return errs
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// kindName names a node's kind for messages: "a list", "a mapping", "the
// string \"dp1\"", "nothing".
func kindName(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Tag == "!!null":
		return "nothing"
	}
	return fmt.Sprintf("%q", n.Value)
}
