// Package identity finds the enrollment material a booting node was handed:
// the control plane's URL, a one-time bootstrap token and the CA
// fingerprint to pin (docs/design.md §3.2). It looks, in order, at the kernel command
// line, QEMU fw_cfg and a seed ISO; values given explicitly as flags win
// over all of them.
package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Found is what one source holds.
type Found struct {
	Fields
	// Warnings are things worth a console line that do not stop the boot.
	Warnings []string
}

// Source is one place enrollment material may come from.
type Source interface {
	// Name is how the console names the source ("kernel command line").
	Name() string
	// Lookup returns the fields the source holds. present is false when the
	// source does not exist on this machine (no fw_cfg, no seed disk); an
	// error means it exists but is unusable, and names what is wrong.
	Lookup(ctx context.Context) (f Found, present bool, err error)
}

// Discovery is the outcome of Discover.
type Discovery struct {
	Fields
	// From names the source of each field: "url", "token", "ca".
	From     map[string]string
	Warnings []string
	// Looked records what each consulted source had, for error messages.
	Looked []string
}

// FlagNames are the command-line flags that set each field explicitly.
var FlagNames = map[string]string{"url": "--control-plane", "token": "--token", "ca": "--ca-sha256", "instance": "--instance"}

// Discover fills the fields from explicit values first, then from each
// source in order, each field taken from the first place that has it. It
// stops consulting sources once every field is known, so a node handed
// everything on its command line never scans its disks. An unusable source
// is an error even if a later one might have helped: a half-broken
// hand-off is something the operator must hear about, not something to
// paper over.
//
// Discover does not insist on every field: a node that saved a certificate
// before switching root needs no token. Use Require for that.
func Discover(ctx context.Context, explicit Fields, sources ...Source) (Discovery, error) {
	d := Discovery{From: make(map[string]string)}
	checked, err := explicit.check(func(field string) string { return "flag " + FlagNames[field] })
	if err != nil {
		return Discovery{}, err
	}
	d.merge(checked, "flag")
	for _, src := range sources {
		if d.complete() {
			break
		}
		if err := ctx.Err(); err != nil {
			return Discovery{}, fmt.Errorf("discover: %w", err)
		}
		f, present, err := src.Lookup(ctx)
		if err != nil {
			if strings.HasPrefix(err.Error(), src.Name()) {
				return Discovery{}, err
			}
			return Discovery{}, fmt.Errorf("%s: %w", src.Name(), err)
		}
		d.Warnings = append(d.Warnings, f.Warnings...)
		if !present {
			d.Looked = append(d.Looked, src.Name()+": not present")
			continue
		}
		d.Looked = append(d.Looked, src.Name()+": "+describe(f.Fields))
		d.merge(f.Fields, src.Name())
	}
	return d, nil
}

func (d *Discovery) merge(f Fields, from string) {
	set := func(dst *string, v, field string) {
		if *dst == "" && v != "" {
			*dst = v
			d.From[field] = from
		}
	}
	set(&d.URL, f.URL, "url")
	set(&d.Token, f.Token, "token")
	set(&d.CA, f.CA, "ca")
	set(&d.Instance, f.Instance, "instance")
}

func describe(f Fields) string {
	var have []string
	for _, x := range []struct{ name, v string }{{"url", f.URL}, {"token", f.Token}, {"ca", f.CA}, {"instance", f.Instance}} {
		if x.v != "" {
			have = append(have, x.name)
		}
	}
	if len(have) == 0 {
		return "nothing"
	}
	return strings.Join(have, ", ")
}

// ErrIncomplete is wrapped by Require's error.
var ErrIncomplete = errors.New("enrollment material incomplete")

// Require checks that the fields the caller needs were found and, if not,
// (needToken: a token, or the instance id of a TPM-attested enrollment)
// says where the agent looked and how to hand them over.
func (d Discovery) Require(needToken bool) error {
	var missing []string
	if d.URL == "" {
		missing = append(missing, "control plane URL (tether.url=https://HOST:PORT, fw_cfg opt/tether/url, seed ISO tether/url, or --control-plane)")
	}
	if d.Token == "" && d.Instance == "" && needToken {
		missing = append(missing, "bootstrap token (tether.token=, fw_cfg opt/tether/token, seed ISO tether/token, or --token; mint one with `tetherctl token create --instance ID`), "+
			"or, for a node whose TPM is bound to it, its instance id (tether.instance=, fw_cfg opt/tether/instance, or --instance)")
	}
	if d.CA == "" {
		missing = append(missing, "CA fingerprint (tether.ca=sha256:HEX, fw_cfg opt/tether/ca, seed ISO tether/ca, or --ca-sha256)")
	}
	if len(missing) == 0 {
		return nil
	}
	looked := "no source"
	if len(d.Looked) > 0 {
		looked = strings.Join(d.Looked, "; ")
	}
	return fmt.Errorf("%w: missing %s. Looked at: %s", ErrIncomplete, strings.Join(missing, "; "), looked)
}

// Summary is a console line saying where each field came from.
func (d Discovery) Summary() string {
	var parts []string
	for _, f := range []string{"url", "token", "ca"} {
		if src, ok := d.From[f]; ok {
			parts = append(parts, f+" from "+src)
		}
	}
	if len(parts) == 0 {
		return "nothing found"
	}
	return strings.Join(parts, ", ")
}
