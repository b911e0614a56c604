module github.com/idemkit/idem/idemschema

go 1.26.0

replace github.com/idemkit/idem => ../

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
	github.com/stretchr/testify v1.12.1
	golang.org/x/text v0.43.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
