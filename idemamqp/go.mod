module github.com/idemkit/idem/idemamqp

go 1.26.0

replace github.com/idemkit/idem => ../

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
