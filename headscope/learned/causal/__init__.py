"""What heads do, causally (issue 33): activation patching on clean/corrupt prompt pairs, attribution patching
checked against it, direct logit attribution and composition scores."""
