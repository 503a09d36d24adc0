package modulebuild

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Kind is what a build source is.
type Kind string

const (
	KindAuto          Kind = ""
	KindDir           Kind = "dir"            // a folder holding the root
	KindTar           Kind = "tar"            // a root as one tar stream (docker export, tar -c), maybe gzip
	KindOCILayout     Kind = "oci"            // an OCI image layout folder (oci-layout, index.json, blobs/)
	KindDockerArchive Kind = "docker-archive" // docker save output, maybe gzip
	KindOCIArchive    Kind = "oci-archive"    // an OCI image layout as one tar (skopeo oci-archive:, buildx type=oci)
	KindImage         Kind = "image"          // an image reference pulled from a registry
)

// Kinds lists the kinds a --source flag may name.
var Kinds = []Kind{KindDir, KindTar, KindOCILayout, KindOCIArchive, KindDockerArchive, KindImage}

// detect says what src is. A path that exists is a folder, an OCI layout
// folder, a docker save archive or a root tarball; anything else must
// parse as an image reference.
func detect(src string) (Kind, error) {
	if src == "-" {
		return KindTar, nil // stdin is spooled and looked at again by the caller
	}
	st, err := os.Stat(src)
	if err == nil {
		if st.IsDir() {
			if _, err := os.Stat(filepath.Join(src, "oci-layout")); err == nil {
				return KindOCILayout, nil
			}
			return KindDir, nil
		}
		return detectFile(src)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	// A mistyped file name must not turn into a pull from Docker Hub.
	if strings.HasPrefix(src, "/") || strings.HasPrefix(src, ".") || hasArchiveSuffix(src) {
		return "", fmt.Errorf("source %s: no such file or folder", src)
	}
	if _, perr := name.ParseReference(src); perr != nil {
		return "", fmt.Errorf("source %s: not a file or folder here, and not an image reference: %w", src, perr)
	}
	return KindImage, nil
}

func hasArchiveSuffix(s string) bool {
	for _, x := range []string{".tar", ".tar.gz", ".tgz", ".gz", ".oci"} {
		if strings.HasSuffix(s, x) {
			return true
		}
	}
	return false
}

// detectFile tells a docker save archive (manifest.json at the top beside
// layer blobs) from a root tarball by reading its headers.
func detectFile(p string) (Kind, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := maybeGunzip(f)
	if err != nil {
		return "", err
	}
	tr := tar.NewReader(r)
	// An OCI layout in a tar has oci-layout and index.json at the top; a
	// docker save from docker 25 on has them too, beside manifest.json,
	// and is read as docker's. Unpacking either as a root would make a
	// module of blobs, so they are told apart here.
	var ociLayout, index bool
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if ociLayout && index {
				return KindOCIArchive, nil
			}
			return KindTar, nil
		}
		if err != nil {
			return "", fmt.Errorf("not a tar archive, or a broken one: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		switch path.Clean(hdr.Name) {
		case "manifest.json":
			if isDockerManifest(tr) {
				return KindDockerArchive, nil
			}
		case "oci-layout":
			ociLayout = true
		case "index.json":
			index = true
		}
	}
}

// isDockerManifest reports whether r is docker save's manifest.json: a
// list of images, each with a config and layers. A root that merely holds
// a file of that name is not taken for an archive.
func isDockerManifest(r io.Reader) bool {
	var m []struct {
		Config string
		Layers []string
	}
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&m); err != nil || len(m) == 0 {
		return false
	}
	return m[0].Config != "" && len(m[0].Layers) > 0
}

// maybeGunzip returns r decompressed when it starts with the gzip magic.
func maybeGunzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	}
	return br, nil
}

// openImage finds the image for platform in an OCI layout, a docker save
// archive or a registry.
func openImage(ctx context.Context, kind Kind, src string, p v1.Platform, insecure bool) (v1.Image, error) {
	switch kind {
	case KindOCILayout:
		idx, err := layout.ImageIndexFromPath(src)
		if err != nil {
			return nil, fmt.Errorf("oci layout %s: %w", src, err)
		}
		img, err := pickFromIndex(idx, p, "oci layout "+src)
		if err != nil {
			return nil, err
		}
		return img, checkPlatform(img, p, "oci layout "+src)
	case KindDockerArchive:
		opener := func() (io.ReadCloser, error) {
			f, err := os.Open(src)
			if err != nil {
				return nil, err
			}
			r, err := maybeGunzip(f)
			if err != nil {
				f.Close()
				return nil, err
			}
			return readCloser{r, f}, nil
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, fmt.Errorf("docker archive %s (one image per archive): %w", src, err)
		}
		return img, checkPlatform(img, p, "docker archive "+src)
	case KindImage:
		var opts []name.Option
		if insecure {
			opts = append(opts, name.Insecure)
		}
		ref, err := name.ParseReference(src, opts...)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", src, err)
		}
		ropts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(p), remote.WithContext(ctx)}
		desc, err := remote.Get(ref, ropts...)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", src, err)
		}
		var img v1.Image
		if desc.MediaType.IsIndex() {
			idx, err := desc.ImageIndex()
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", src, err)
			}
			if img, err = pickFromIndex(idx, p, "image "+src); err != nil {
				return nil, err
			}
		} else if img, err = desc.Image(); err != nil {
			return nil, fmt.Errorf("image %s: %w", src, err)
		}
		return img, checkPlatform(img, p, "image "+src)
	}
	return nil, fmt.Errorf("source kind %q is not an image", kind)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// pickFromIndex walks an index (and nested indexes, as buildx writes them)
// for the manifest of platform p. A manifest without a platform is taken
// and checked against its config afterwards.
func pickFromIndex(idx v1.ImageIndex, p v1.Platform, what string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index: %w", what, err)
	}
	var seen []string
	var untagged *v1.Descriptor
	for i := range im.Manifests {
		d := im.Manifests[i]
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("%s: index %s: %w", what, d.Digest, err)
			}
			img, err := pickFromIndex(child, p, what)
			if err == nil {
				return img, nil
			}
			var pe *PlatformError
			if !errors.As(err, &pe) {
				return nil, err
			}
			seen = append(seen, pe.Have...)
		case d.MediaType.IsImage():
			if d.Platform == nil {
				if untagged == nil {
					untagged = &d
				}
				continue
			}
			if d.Platform.OS == "unknown" { // buildx attestation manifests
				continue
			}
			if d.Platform.Satisfies(p) {
				return idx.Image(d.Digest)
			}
			seen = append(seen, d.Platform.String())
		}
	}
	if untagged != nil {
		return idx.Image(untagged.Digest)
	}
	return nil, &PlatformError{What: what, Want: p.String(), Have: seen}
}

// checkPlatform compares the image config's platform with the one wanted:
// a single-manifest image for arm64 must not become an amd64 node's root.
func checkPlatform(img v1.Image, p v1.Platform, what string) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("%s: config: %w", what, err)
	}
	have := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	if have.OS == "" && have.Architecture == "" {
		return nil // docker save of old images may omit it; nothing to compare
	}
	if !have.Satisfies(p) {
		return &PlatformError{What: what, Want: p.String(), Have: []string{have.String()}}
	}
	return nil
}

// PlatformError says a source has no image for the platform asked for.
type PlatformError struct {
	What string
	Want string
	Have []string
}

func (e *PlatformError) Error() string {
	return fmt.Sprintf("%s has no image for %s (it has %s); choose one with --platform",
		e.What, e.Want, strings.Join(e.Have, ", "))
}
