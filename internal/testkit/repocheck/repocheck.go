// Package repocheck keeps the repository standing alone: a user who clones
// it has nothing beside it, so no file may send a reader to a path outside
// the clone (a sibling folder, a developer's machine, a document that is
// not in the tree) and no Markdown link may point at a file that is not
// here. The contract such references used to name lives in docs/design.md
// and the layout in docs/architecture.md.
//
// Code comments cite the contract as "docs/design.md §N.M"; Citations
// checks that each cited section exists, and LinkAnchors that each
// Markdown link's #fragment names a heading.
//
// The checks work on one file's name and bytes so they can be tested on
// planted examples; the repository-wide run is a test in this package that
// walks `git ls-files` (`make lint` runs it).
package repocheck

import (
	"bytes"
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode"
)

// Finding is one reference to something outside the repository.
type Finding struct {
	File string
	Line int
	// Match is the offending text, Why says what it points at and what to
	// write instead.
	Match, Why string
}

func (f Finding) String() string {
	if f.Line == 0 { // a finding about the whole file, such as an import
		return fmt.Sprintf("%s: %q: %s", f.File, f.Match, f.Why)
	}
	return fmt.Sprintf("%s:%d: %q: %s", f.File, f.Line, f.Match, f.Why)
}

type rule struct {
	re  *regexp.Regexp
	why string
}

// rules are the shapes an outside reference takes. They are matched line by
// line, case-sensitively: the upper-case word names a section of a
// specification a clone does not have, while providers.Spec is an ordinary
// identifier. A bracketed letter ([P], [o]) keeps each pattern from
// matching its own source text, so this file passes its own check.
var rules = []rule{
	{regexp.MustCompile(`\.\./+shared\b`), "a folder beside the clone, which a user does not have; cite docs/design.md or docs/architecture.md"},
	{regexp.MustCompile(`\bshared/+(S[P]EC|ARCHITECTURE|notes|reference|peers)\b`), "a document outside the repository; cite docs/design.md or docs/architecture.md"},
	{regexp.MustCompile(`\b(S[P]EC|ARCHITECTUR[E])\.md\b`), "a document outside the repository; cite docs/design.md or docs/architecture.md"},
	{regexp.MustCompile(`\bS[P]EC\b`), "a section of a specification outside the repository; cite docs/design.md §N"},
	{regexp.MustCompile(`(^|[^\w.\-/])/w[o]rk/`), "a path on a development machine"},
	{regexp.MustCompile(`(^|[^\w.\-/])/tmp/i[s]s\b`), "an issue tracker's scratch folder on a development machine"},
	{regexp.MustCompile(`(^|[^\w.\-/])/(h[o]me|U[s]ers)/[A-Za-z]`), "a user's home directory on a development machine"},
	{regexp.MustCompile(`\.l[i]brary/`), "a tool folder outside the repository"},
}

// Scan returns the outside references in one file. name is the file's path
// relative to the repository root (slash-separated); binary files (any NUL
// byte) are skipped. exists reports whether a relative path is in the
// repository; it is used for Markdown links and may be nil to skip them.
func Scan(name string, content []byte, exists func(string) bool) []Finding {
	if bytes.IndexByte(content, 0) >= 0 {
		return nil
	}
	var out []Finding
	markdown := strings.HasSuffix(name, ".md")
	for i, line := range strings.Split(string(content), "\n") {
		for _, r := range rules {
			if m := r.re.FindString(line); m != "" {
				out = append(out, Finding{File: name, Line: i + 1, Match: strings.TrimLeft(m, " \t\"'`(=:"), Why: r.why})
			}
		}
		if markdown && exists != nil {
			out = append(out, links(name, i+1, line, exists)...)
		}
	}
	return out
}

// mdLink is an inline Markdown link or image: [text](target "title").
var mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// links checks a Markdown line's relative links: each must resolve to a
// file or folder inside the repository.
func links(name string, lineNo int, line string, exists func(string) bool) []Finding {
	var out []Finding
	for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
		target := m[1]
		if isExternal(target) {
			continue
		}
		if j := strings.IndexAny(target, "#?"); j >= 0 {
			target = target[:j]
		}
		if target == "" {
			continue // an anchor in the same file
		}
		var p string
		if strings.HasPrefix(target, "/") {
			p = path.Clean(strings.TrimPrefix(target, "/"))
		} else {
			p = path.Join(path.Dir(name), target)
		}
		switch {
		case p == ".." || strings.HasPrefix(p, "../"):
			out = append(out, Finding{File: name, Line: lineNo, Match: m[1], Why: "a link that leaves the repository"})
		case !exists(p):
			out = append(out, Finding{File: name, Line: lineNo, Match: m[1], Why: fmt.Sprintf("a link to %s, which is not in the repository", p)})
		}
	}
	return out
}

func isExternal(target string) bool {
	for _, scheme := range []string{"http://", "https://", "mailto:", "ftp://"} {
		if strings.HasPrefix(target, scheme) {
			return true
		}
	}
	return false
}

// designHeading is a numbered heading of docs/design.md ("## 2. Instance
// lifecycle", "### 2.2 Transitions") or a numbered principle ("**0.1 Say
// what happened.**").
var designHeading = regexp.MustCompile(`^(?:#{2,4} +|\*\*)(\d+(?:\.\d+)*)\.? `)

// Sections returns the section numbers docs/design.md defines.
func Sections(design []byte) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(string(design), "\n") {
		if m := designHeading.FindStringSubmatch(line); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// citation is a section sign and its number: §2, §2.6.
var citation = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)

// DesignDoc is where the contract lives.
const DesignDoc = "docs/design.md"

// Citations checks that every section a file cites from docs/design.md
// exists there: on a line that names docs/design.md (or design.md, from
// beside it), and anywhere in the design document itself, each §N.M must
// be one of sections. A renumbered section would otherwise leave code
// comments pointing at the wrong promise.
func Citations(name string, content []byte, sections map[string]bool) []Finding {
	if bytes.IndexByte(content, 0) >= 0 {
		return nil
	}
	var out []Finding
	self := name == DesignDoc
	for i, line := range strings.Split(string(content), "\n") {
		if !self && !strings.Contains(line, "design.md") {
			continue
		}
		for _, m := range citation.FindAllStringSubmatch(line, -1) {
			if !sections[m[1]] {
				out = append(out, Finding{File: name, Line: i + 1, Match: m[0],
					Why: fmt.Sprintf("%s has no section %s", DesignDoc, m[1])})
			}
		}
	}
	return out
}

// mdHeading is an ATX heading.
var mdHeading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// Anchors returns the fragment ids a Markdown renderer such as GitHub's
// gives the headings of a document: lower case, punctuation dropped,
// spaces as hyphens, and -1, -2 ... on repeats. Fenced code is skipped.
func Anchors(content []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(content), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		m := mdHeading.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		slug := Slug(m[1])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Slug is a heading's fragment id.
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case r > 127 && unicode.IsLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// LinkAnchors checks the fragments of a Markdown file's links to Markdown
// files in the repository (its own headings included): each must name a
// heading there. anchorsOf returns a document's anchors, and false when
// the document is not in the repository (Scan reports those links).
func LinkAnchors(name string, content []byte, anchorsOf func(p string) (map[string]bool, bool)) []Finding {
	if !strings.HasSuffix(name, ".md") {
		return nil
	}
	var out []Finding
	for i, line := range strings.Split(string(content), "\n") {
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			j := strings.IndexByte(target, '#')
			if isExternal(target) || j < 0 {
				continue
			}
			file, frag := target[:j], target[j+1:]
			p := name
			if file != "" {
				p = path.Join(path.Dir(name), file)
			}
			if !strings.HasSuffix(p, ".md") {
				continue
			}
			anchors, ok := anchorsOf(p)
			if ok && !anchors[frag] {
				out = append(out, Finding{File: name, Line: i + 1, Match: m[1],
					Why: fmt.Sprintf("%s has no heading with the anchor #%s", p, frag)})
			}
		}
	}
	return out
}
