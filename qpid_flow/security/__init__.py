"""Who may connect and do what, sans-IO: TLS over memory buffers, the SASL layer, sign-in
against the users file, and the access rules. No Proton here."""
