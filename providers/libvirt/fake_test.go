package libvirt

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"strings"
	"sync"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// fakeLibvirtd is an in-memory libvirtd: enough of its domain API, with its
// error numbers, for the provider's logic without a daemon.
type fakeLibvirtd struct {
	mu      sync.Mutex
	domains map[string]*fakeDomain
	caps    string
	// fail makes the named call fail (once per entry, in order).
	fail map[string][]error
	// calls records every call, "Create tether-x".
	calls []string
	// ignoreACPI keeps a domain running after Shutdown (like Tether's
	// initramfs agent, which has no ACPI handler).
	ignoreACPI bool
	// dialErr fails every session.
	dialErr error
	// streams are the open LifecycleEvents subscriptions; subscribed is
	// told each new one.
	streams    []chan golibvirt.DomainEventLifecycleMsg
	subscribed chan struct{}
	// readToken is called with the token file's content at Create.
	tokens []string
	nextID int
}

type fakeDomain struct {
	name, uuid, xml string
	state           golibvirt.DomainState
	reason          int32
}

func newFakeLibvirtd() *fakeLibvirtd {
	return &fakeLibvirtd{domains: map[string]*fakeDomain{}, fail: map[string][]error{},
		caps: `<capabilities><host/><guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/></arch></guest></capabilities>`}
}

func lverr(code golibvirt.ErrorNumber, msg string) error {
	return golibvirt.Error{Code: uint32(code), Message: msg}
}

func (f *fakeLibvirtd) dial(ctx context.Context) (hypervisor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dialErr != nil {
		return nil, f.dialErr
	}
	return &fakeSession{f: f, ctx: ctx}, nil
}

// failNext makes the next call of op fail with err.
func (f *fakeLibvirtd) failNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = append(f.fail[op], err)
}

func (f *fakeLibvirtd) callsOf(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeLibvirtd) domain(name string) *fakeDomain {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.domains[name]
	if d == nil {
		return nil
	}
	c := *d
	return &c
}

func (f *fakeLibvirtd) setState(name string, st golibvirt.DomainState, reason int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.domains[name].state, f.domains[name].reason = st, reason
}

type fakeSession struct {
	f   *fakeLibvirtd
	ctx context.Context
}

// enter records a call and returns its injected failure, if any. f.mu is
// held on return.
func (s *fakeSession) enter(op, name string) error {
	s.f.mu.Lock()
	s.f.calls = append(s.f.calls, strings.TrimSpace(op+" "+name))
	if s.ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errSessionEnded, s.ctx.Err())
	}
	if errs := s.f.fail[op]; len(errs) > 0 {
		s.f.fail[op] = errs[1:]
		return errs[0]
	}
	return nil
}

func (s *fakeSession) get(name string) (*fakeDomain, error) {
	d := s.f.domains[name]
	if d == nil {
		return nil, lverr(golibvirt.ErrNoDomain, "Domain not found: no domain with matching name '"+name+"'")
	}
	return d, nil
}

func (s *fakeSession) Capabilities() (string, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("Capabilities", ""); err != nil {
		return "", err
	}
	return s.f.caps, nil
}

func (s *fakeSession) LookupByName(name string) (golibvirt.Domain, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("LookupByName", name); err != nil {
		return golibvirt.Domain{}, err
	}
	d, err := s.get(name)
	if err != nil {
		return golibvirt.Domain{}, err
	}
	return golibvirt.Domain{Name: d.name}, nil
}

func (s *fakeSession) DefineXML(x string) (golibvirt.Domain, error) {
	defer s.f.mu.Unlock()
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		return golibvirt.Domain{}, lverr(golibvirt.ErrXMLError, err.Error())
	}
	if err := s.enter("DefineXML", dom.Name); err != nil {
		return golibvirt.Domain{}, err
	}
	d := s.f.domains[dom.Name]
	if d == nil {
		if dom.UUID != "" {
			return golibvirt.Domain{}, lverr(golibvirt.ErrInvalidArg, "a new domain with a UUID the test did not expect")
		}
		s.f.nextID++
		d = &fakeDomain{name: dom.Name, uuid: fmt.Sprintf("00000000-0000-0000-0000-%012d", s.f.nextID), state: golibvirt.DomainShutoff}
		s.f.domains[dom.Name] = d
	} else if dom.UUID != d.uuid {
		return golibvirt.Domain{}, lverr(golibvirt.ErrOperationFailed, "domain '"+dom.Name+"' already exists with uuid "+d.uuid)
	}
	dom.UUID = d.uuid
	d.xml, _ = dom.Marshal()
	return golibvirt.Domain{Name: d.name}, nil
}

func (s *fakeSession) Create(dd golibvirt.Domain) error {
	defer s.f.mu.Unlock()
	if err := s.enter("Create", dd.Name); err != nil {
		return err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return err
	}
	if d.state == golibvirt.DomainRunning {
		return lverr(golibvirt.ErrOperationInvalid, "domain is already running")
	}
	// QEMU reads its fw_cfg files at start-up.
	var dom libvirtxml.Domain
	_ = dom.Unmarshal(d.xml)
	for _, si := range dom.SysInfo {
		if si.FWCfg == nil {
			continue
		}
		for _, e := range si.FWCfg.Entry {
			if e.File != "" {
				b, err := os.ReadFile(e.File)
				if err != nil {
					return lverr(golibvirt.ErrInternalError, "process exited while connecting to monitor: "+err.Error())
				}
				s.f.tokens = append(s.f.tokens, string(b))
			}
		}
	}
	d.state, d.reason = golibvirt.DomainRunning, int32(golibvirt.DomainRunningBooted)
	return nil
}

func (s *fakeSession) Shutdown(dd golibvirt.Domain) error {
	defer s.f.mu.Unlock()
	if err := s.enter("Shutdown", dd.Name); err != nil {
		return err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return err
	}
	if d.state != golibvirt.DomainRunning {
		return lverr(golibvirt.ErrOperationInvalid, "domain is not running")
	}
	if !s.f.ignoreACPI {
		d.state, d.reason = golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffShutdown)
	}
	return nil
}

func (s *fakeSession) Destroy(dd golibvirt.Domain) error {
	defer s.f.mu.Unlock()
	if err := s.enter("Destroy", dd.Name); err != nil {
		return err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return err
	}
	if d.state == golibvirt.DomainShutoff {
		return lverr(golibvirt.ErrOperationInvalid, "domain is not running")
	}
	d.state, d.reason = golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffDestroyed)
	return nil
}

func (s *fakeSession) Undefine(dd golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error {
	defer s.f.mu.Unlock()
	if err := s.enter(fmt.Sprintf("Undefine(%d)", flags), dd.Name); err != nil {
		return err
	}
	if _, err := s.get(dd.Name); err != nil {
		return err
	}
	delete(s.f.domains, dd.Name)
	return nil
}

func (s *fakeSession) State(dd golibvirt.Domain) (golibvirt.DomainState, int32, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("State", dd.Name); err != nil {
		return 0, 0, err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return 0, 0, err
	}
	return d.state, d.reason, nil
}

func (s *fakeSession) ListAll() ([]golibvirt.Domain, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("ListAll", ""); err != nil {
		return nil, err
	}
	var out []golibvirt.Domain
	for _, d := range s.f.domains {
		out = append(out, golibvirt.Domain{Name: d.name})
	}
	return out, nil
}

func (s *fakeSession) XMLDesc(dd golibvirt.Domain) (string, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("XMLDesc", dd.Name); err != nil {
		return "", err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return "", err
	}
	return d.xml, nil
}

// Metadata answers like libvirtd: the element in ns, without its prefix.
func (s *fakeSession) Metadata(dd golibvirt.Domain, ns string) (string, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("Metadata", dd.Name); err != nil {
		return "", err
	}
	d, err := s.get(dd.Name)
	if err != nil {
		return "", err
	}
	var dom libvirtxml.Domain
	_ = dom.Unmarshal(d.xml)
	if dom.Metadata != nil {
		var el struct {
			XMLName xml.Name
			Value   string `xml:",chardata"`
		}
		if xml.Unmarshal([]byte(dom.Metadata.XML), &el) == nil && el.XMLName.Space == ns {
			return "<" + el.XMLName.Local + ">" + el.Value + "</" + el.XMLName.Local + ">", nil
		}
	}
	return "", lverr(golibvirt.ErrNoDomainMetadata, "metadata not found: Requested metadata element is not present")
}

func (s *fakeSession) Close() error { return nil }

func (s *fakeSession) LifecycleEvents(ctx context.Context) (<-chan golibvirt.DomainEventLifecycleMsg, error) {
	defer s.f.mu.Unlock()
	if err := s.enter("LifecycleEvents", ""); err != nil {
		return nil, err
	}
	ch := make(chan golibvirt.DomainEventLifecycleMsg, 16)
	s.f.streams = append(s.f.streams, ch)
	if s.f.subscribed != nil {
		s.f.subscribed <- struct{}{}
	}
	context.AfterFunc(ctx, func() { s.f.dropEvents() })
	return ch, nil
}

// emit sends a lifecycle event to every subscriber.
func (f *fakeLibvirtd) emit(name string, ev golibvirt.DomainEventType, detail int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.streams {
		ch <- golibvirt.DomainEventLifecycleMsg{Dom: golibvirt.Domain{Name: name}, Event: int32(ev), Detail: detail}
	}
}

// dropEvents ends every subscription, as a libvirtd restart does.
func (f *fakeLibvirtd) dropEvents() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.streams {
		close(ch)
	}
	f.streams = nil
}

// plant adds a domain the provider did not define.
func (f *fakeLibvirtd) plant(name, metadata string, st golibvirt.DomainState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	dom := libvirtxml.Domain{Type: "qemu", Name: name, UUID: fmt.Sprintf("00000000-0000-0000-0000-%012d", f.nextID)}
	if metadata != "" {
		dom.Metadata = &libvirtxml.DomainMetadata{XML: metadata}
	}
	x, _ := dom.Marshal()
	f.domains[name] = &fakeDomain{name: name, uuid: dom.UUID, xml: x, state: st}
}
