"""A request made into prompt tokens: messages normalized, the model's chat template, images and
vision prompts, tools for templates without any, fill-in-the-middle, control text kept as text."""
