// Package idemschema is an idem.Validator that checks each event's payload against the JSON
// Schema of its event type (drafts 4 to 2020-12, through santhosh-tekuri/jsonschema), after
// refusing, cheaply and before any schema work, payloads that are not UTF-8, not JSON, or
// nested deeper than a bound. Every refusal wraps idem.ErrInvalidPayload, names the event and
// says in words where the payload is wrong ("/amount_cents: got string, want integer"), so the
// dead letter it becomes can be acted on.
package idemschema

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/idemkit/idem"
)

// Defaults and bounds of Config.
const (
	// MaxDepthDefault is Config.MaxDepth when unset: real events nest a handful of levels, and
	// 64 leaves room for any sane document while keeping hostile nesting away from the decoder.
	MaxDepthDefault = 64
	// MaxDepthMax is the largest Config.MaxDepth: encoding/json refuses documents nested deeper
	// than 10000 levels on its own.
	MaxDepthMax = 10000
	// maxReported bounds how many schema violations one error lists.
	maxReported = 5
)

// Config configures a Validator. Zero fields take the documented defaults.
type Config struct {
	// AllowUnknownTypes accepts events of a type without a schema, after the UTF-8, JSON and
	// depth checks; by default they are refused, so a new event type cannot reach handlers
	// unvalidated by accident.
	AllowUnknownTypes bool
	// MaxDepth is the deepest nesting of arrays and objects accepted (default MaxDepthDefault,
	// at most MaxDepthMax). It is checked in one pass over the bytes before anything is
	// decoded, so a hostile document costs no more than its length.
	MaxDepth int
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Config) WithDefaults() Config {
	if o.MaxDepth == 0 {
		o.MaxDepth = MaxDepthDefault
	}
	return o
}

// validate reports an invalid field of options that WithDefaults has filled in.
func (o Config) validate() error {
	if o.MaxDepth < 1 || o.MaxDepth > MaxDepthMax {
		return fmt.Errorf("idemschema: Config.MaxDepth is %d, want 1 to %d", o.MaxDepth, MaxDepthMax)
	}
	return nil
}

// Validator checks payloads against one compiled JSON Schema per event type. It is immutable
// and safe for concurrent use.
type Validator struct {
	schemas map[string]*jsonschema.Schema
	opts    Config
	printer *message.Printer // words the library's violations in English
}

var _ idem.Validator = (*Validator)(nil)

// New compiles schemas (event type → JSON Schema document) and returns a Validator. A schema
// without "$schema" is read as draft 2020-12. "format" is asserted, not just annotated, so that
// a schema saying "date-time" means it. Schemas may "$ref" each other as
// "urn:idemschema:<url-escaped event type>" but never load anything from files or the network.
// Errors name the event type whose schema is wrong.
func New(schemas map[string][]byte, opts Config) (*Validator, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if len(schemas) == 0 && !opts.AllowUnknownTypes {
		return nil, errors.New("idemschema: no schemas and AllowUnknownTypes is false: every event would be refused")
	}
	types := make([]string, 0, len(schemas))
	for typ := range schemas {
		types = append(types, typ)
	}
	sort.Strings(types) // errors come out in a stable order

	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.UseLoader(noLoader{})
	var errs []error
	for _, typ := range types {
		if typ == "" {
			errs = append(errs, errors.New("idemschema: a schema is registered for the empty event type"))
			continue
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schemas[typ]))
		if err != nil {
			errs = append(errs, fmt.Errorf("idemschema: schema of event type %q is not JSON: %w", typ, err))
			continue
		}
		if err := c.AddResource(schemaURL(typ), doc); err != nil {
			errs = append(errs, fmt.Errorf("idemschema: schema of event type %q: %w", typ, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	v := &Validator{schemas: make(map[string]*jsonschema.Schema, len(types)), opts: opts, printer: message.NewPrinter(language.English)}
	for _, typ := range types {
		sch, err := c.Compile(schemaURL(typ))
		if err != nil {
			errs = append(errs, fmt.Errorf("idemschema: schema of event type %q does not compile: %w", typ, err))
			continue
		}
		v.schemas[typ] = sch
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return v, nil
}

// schemaURL is where the schema of typ lives for the compiler and for "$ref".
func schemaURL(typ string) string { return "urn:idemschema:" + url.PathEscape(typ) }

// noLoader refuses every "$ref" that is not another registered schema: schemas are
// configuration, and compiling them must not read files or call out to the network.
type noLoader struct{}

func (noLoader) Load(u string) (any, error) {
	return nil, fmt.Errorf("idemschema: refusing to load %q: a schema may only $ref another registered schema", u)
}

// Types returns the event types that have a schema, sorted.
func (v *Validator) Types() []string {
	types := make([]string, 0, len(v.schemas))
	for t := range v.schemas {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// Validate checks msg.Payload, in this order: valid UTF-8, no nesting deeper than MaxDepth,
// one valid JSON value ("invalid JSON at offset N: …"), a known event type (unless
// AllowUnknownTypes), and the type's schema ("/amount_cents: got string, want integer",
// "missing required field amount_cents"). The first failure is returned, wrapping
// idem.ErrInvalidPayload and naming the event id.
func (v *Validator) Validate(_ context.Context, msg idem.Message) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: event %s: %s", idem.ErrInvalidPayload, msg.EventID, fmt.Sprintf(format, args...))
	}
	if err := checkSyntax(msg.Payload, v.opts.MaxDepth); err != nil {
		return refuse("%s", err)
	}
	sch, ok := v.schemas[msg.Type]
	if !ok {
		if v.opts.AllowUnknownTypes {
			return nil
		}
		if msg.Type == "" {
			return refuse("the event has no type, so no schema applies")
		}
		return refuse("unknown event type %s (schemas exist for %s)", quoteTrunc(msg.Type), v.knownTypes())
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(msg.Payload))
	if err != nil {
		// checkSyntax passed, so this is not expected; refuse rather than trust it.
		return refuse("payload does not decode: %v", err)
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return refuse("schema of event type %q could not be applied: %v", msg.Type, err)
	}
	return refuse("%s", v.describe(ve))
}

// describe turns a validation error tree into one line: the violations at its leaves, each as
// "<JSON pointer>: <reason>", sorted (the library reports object members in map order) and
// capped at maxReported.
func (v *Validator) describe(ve *jsonschema.ValidationError) string {
	var out []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		out = append(out, v.violation(e))
	}
	walk(ve)
	sort.Strings(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return "does not match the schema"
	}
	if len(out) > maxReported {
		more := len(out) - maxReported
		out = append(out[:maxReported], fmt.Sprintf("and %d more", more))
	}
	return strings.Join(out, "; ")
}

// violation words one leaf error. Missing properties are named as fields, the way a person
// reading the event thinks of them.
func (v *Validator) violation(e *jsonschema.ValidationError) string {
	at := pointer(e.InstanceLocation)
	if req, ok := e.ErrorKind.(*kind.Required); ok {
		fields := quoteFieldList(req.Missing)
		word := "field"
		if len(req.Missing) > 1 {
			word = "fields"
		}
		if len(e.InstanceLocation) == 0 {
			return fmt.Sprintf("missing required %s %s", word, fields)
		}
		return fmt.Sprintf("%s: missing required %s %s", at, word, fields)
	}
	return at + ": " + e.ErrorKind.LocalizedString(v.printer)
}

// pointer formats an instance location as a JSON pointer (RFC 6901), "(root)" for the document.
func pointer(loc []string) string {
	if len(loc) == 0 {
		return "(root)"
	}
	var b strings.Builder
	for _, tok := range loc {
		b.WriteByte('/')
		tok = strings.ReplaceAll(tok, "~", "~0")
		b.WriteString(strings.ReplaceAll(tok, "/", "~1"))
	}
	return b.String()
}

// quoteFieldList joins field names, quoting only those that are not plain identifiers.
func quoteFieldList(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		if plainName(n) {
			out[i] = n
		} else {
			out[i] = quoteTrunc(n)
		}
	}
	return strings.Join(out, ", ")
}

func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// knownTypes lists the first few types with a schema, for an unknown-type error.
func (v *Validator) knownTypes() string {
	const max = 10
	types := v.Types()
	var b strings.Builder
	for i, t := range types {
		if i == max {
			fmt.Fprintf(&b, " and %d more", len(types)-max)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(t))
	}
	if b.Len() == 0 {
		return "no type"
	}
	return b.String()
}
