"""How the controller reaches hosts: inventories and fleet variables, SSH options, authentication and known hosts,
the SSH fan-out and the ansible-runner runner. Imports only the core."""
